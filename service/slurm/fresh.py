"""Reservations the filter made in this process that no job has been seen to take yet.

A reservation whose answer reached job_submit.lua too late (past its timeout)
was made for a job that went on without it: no job will ever name it. The
reconcile loop releases such reservations once they are older than the grace
period; this note of when each was made lets it run then, instead of waiting
for its interval. Reservations of other replicas are left to their own loop or
to the interval.
"""

from __future__ import annotations

import threading
import time
from collections import deque


class FreshReservations:
    def __init__(self) -> None:
        self._made: deque[float] = deque()
        self._lock = threading.Lock()

    def note(self) -> None:
        with self._lock:
            self._made.append(time.monotonic())

    def due(self, grace_s: float) -> bool:
        """Whether a reservation noted has passed the grace period since (forgets it)."""
        cutoff = time.monotonic() - grace_s
        found = False
        with self._lock:
            while self._made and self._made[0] <= cutoff:
                self._made.popleft()
                found = True
        return found


FRESH = FreshReservations()
