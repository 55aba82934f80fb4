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
# A bound on the keys remembered, so that memory stays bounded whatever the keys. Only a
# key whose window has passed is forgotten while there are any (it would be let through
# anyway, so nothing is logged early); only past this many keys each inside its window is
# the oldest forgotten, which costs it one line early. As many as the mismatch log keeps
# unmoved differences (service/k8s/node_devices.py), each one a key of its gate; an entry
# is a key, a float and maybe a count, so a full gate is a few MB.
MAX_KEYS = 10_000


class LogGate:
    """At most one line per key per ``every_s``; thread-safe (request threads, the loop)."""

    def __init__(
        self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        # Key -> when its line was last let through, in that order (oldest first): the
        # clock only moves forward, so the expired are always at the front.
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
                self._make_room(now)
            # Moved to the end: the order stays that of the lines let through.
            self._last.pop(key, None)
            self._last[key] = now
            return self._held.pop(key, 0)

    def _make_room(self, now: float) -> None:
        """Make room for one key: every key whose window has passed (each amortised once,
        as each was added once), else the oldest one. A forgotten key's count of lines
        held back goes with it, so its next line says 0: bounded memory's price."""
        while self._last:
            oldest, last = next(iter(self._last.items()))
            expired = now - last >= self.every_s
            if not expired and len(self._last) < MAX_KEYS:
                return  # the expired are gone, and that made room
            del self._last[oldest]
            self._held.pop(oldest, None)
            if not expired:
                return  # the oldest still inside its window: forgotten for one room only
