"""A log line that would repeat on every request or report, let through once a while.

Some failures are met by every caller while they last: a database that does not
answer (service/database_unreachable.py), a Kubernetes API that cannot be read
for each pod of each node's device report (service/k8s/node_devices.py, every
10 s per node). Each meeting logged would bury the log; none logged would hide
the cause. A gate lets a line of one key through at most once per
``LOG_EVERY_S``, and counts the ones it held back so the next line can say how
many there were.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

LOG_EVERY_S = 10.0
# A bound on the keys remembered (not on how long anything lasts): a key forgotten is
# logged once more than it would have been, which costs one line.
MAX_KEYS = 100


class LogGate:
    """At most one line per key per ``every_s``; thread-safe (request threads, the loop)."""

    def __init__(
        self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}

    def due(self, key: Hashable) -> int | None:
        """None while a line of ``key`` was let through within ``every_s`` (this one is
        held back and counted); else how many were held back since the last (0 the first
        time), and the line is to be logged now."""
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.every_s:
                self._held[key] = self._held.get(key, 0) + 1
                return None
            if last is None and len(self._last) >= MAX_KEYS:
                self._last.clear()
                self._held.clear()
            self._last[key] = now
            return self._held.pop(key, 0)
