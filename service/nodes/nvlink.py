"""The latest NVLink counters of every node, as its agent reported them with a heartbeat.

Kept in memory only: they are a reading, not a fact the service decides
with, and a restarted service has the next ones within one report interval.
The store is bounded: one reading per node the service knows (a node's
reading is dropped with the node), at most ``MAX_GPUS`` x ``MAX_LINKS`` links
each (the report's schema refuses more), and it keeps one reading per node
per ``min_interval_s``: an agent that reports more often (a misconfigured
interval, a loop) has the extra readings dropped, counted on /metrics as
``too_soon``, and its heartbeats still taken.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import datetime

# NVML_NVLINK_MAX_LINKS: the most links NVML numbers on one GPU.
MAX_LINKS = 36
COUNTERS = (
    "tx_bytes",
    "rx_bytes",
    "crc_flit_errors",
    "crc_data_errors",
    "replay_errors",
    "recovery_errors",
)


@dataclass(frozen=True, slots=True)
class LinkCounters:
    """One link's counters since the driver loaded; None where the GPU does not offer one."""

    gpu: int
    link: int
    tx_bytes: int | None = None
    rx_bytes: int | None = None
    crc_flit_errors: int | None = None
    crc_data_errors: int | None = None
    replay_errors: int | None = None
    recovery_errors: int | None = None


@dataclass(frozen=True, slots=True)
class NodeTelemetry:
    node: str
    at: datetime  # when the service took the reading (the agent's clock is not trusted)
    links: tuple[LinkCounters, ...]


class NvlinkStore:
    """Thread-safe: heartbeats arrive on worker threads, /metrics reads on another."""

    def __init__(self, min_interval_s: float) -> None:
        self.min_interval_s = min_interval_s
        self._latest: dict[str, NodeTelemetry] = {}
        self._lock = threading.Lock()

    def offer(self, reading: NodeTelemetry) -> bool:
        """Keep ``reading`` as its node's latest; False (dropped) when the last one kept is
        under ``min_interval_s`` old."""
        with self._lock:
            last = self._latest.get(reading.node)
            if last is not None and (reading.at - last.at).total_seconds() < self.min_interval_s:
                return False
            self._latest[reading.node] = reading
            return True

    def get(self, node: str) -> NodeTelemetry | None:
        with self._lock:
            return self._latest.get(node)

    def forget(self, node: str) -> None:
        with self._lock:
            self._latest.pop(node, None)

    def readings(self) -> list[NodeTelemetry]:
        with self._lock:
            return list(self._latest.values())
