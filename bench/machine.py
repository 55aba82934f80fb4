"""What machine a benchmark ran on, printed at the top of every report."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    return (
        f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"Python {sys.version.split()[0]}, {platform.machine()}"
    )


def _cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot; (0, 0) where /proc/stat is missing."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0, 0
    values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
    return (values[7] if len(values) > 7 else 0), sum(values)


class StealMeter:
    """The share of CPU time the hypervisor took from this VM between start() and
    percent(): on a shared VM, latency tails line up with it, so reports print it."""

    def __init__(self) -> None:
        self._start = _cpu_times()

    def percent(self) -> float:
        steal, total = _cpu_times()
        spent = total - self._start[1]
        return 100.0 * (steal - self._start[0]) / spent if spent > 0 else 0.0
