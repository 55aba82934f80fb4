"""The machine report's steal meter reads the share the hypervisor took, from /proc/stat."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import machine


def _stat(steal: int, total_rest: int) -> str:
    # user nice system idle iowait irq softirq steal guest guest_nice
    return f"cpu  {total_rest} 0 0 0 0 0 0 {steal} 0 0\ncpu0 1 2 3\n"


def test_steal_percent_is_the_share_of_time_taken_between_readings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    stat = tmp_path / "stat"
    stat.write_text(_stat(steal=10, total_rest=990))
    real_path = machine.Path
    monkeypatch.setattr(machine, "Path", lambda p: stat if p == "/proc/stat" else real_path(p))
    meter = machine.StealMeter()
    stat.write_text(_stat(steal=40, total_rest=1960))  # 30 of the next 1,000 jiffies stolen
    assert meter.percent() == pytest.approx(3.0)


def test_no_time_passed_or_no_proc_reads_as_zero(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "absent"
    real_path = machine.Path
    monkeypatch.setattr(machine, "Path", lambda p: missing if p == "/proc/stat" else real_path(p))
    assert machine.StealMeter().percent() == 0.0
