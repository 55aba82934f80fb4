"""The database's clock, as each replica keeps it: the one clock every decision uses.

A reservation's ``expires_at`` is stamped by the replica that placed it and
judged by whichever replica sweeps, confirms or extends it; a node's heartbeat
is stamped by the replica that took it and judged stale by every replica. On
their hosts' own clocks, a replica 60 s ahead expired another's 30-second
reservation as soon as it was made (its GPUs then went to a second job while
the first, told it held them, started on them), and one 60 s behind kept
placing on a node silent for longer than the heartbeat TTL. So on Postgres
every replica decides on the database server's clock: ``DatabaseTime`` reads
it (``clock_timestamp()``) at start and every ``MEASURE_INTERVAL_S``, and in
between adds the time elapsed on this host's monotonic clock, which no NTP
step moves. Its error is at most half the round trip of the read that anchored
it (a read slower than ``MAX_ROUND_TRIP_S`` keeps the anchor before it) plus
the monotonic clock's drift over one interval (NTP slews it by at most 500
ppm: 5 ms). The host's offset from the database is logged when it exceeds
``OFFSET_WARN_S`` and shown as ``topoplace_clock_offset_seconds``; it no
longer changes any decision, so it does not make the replica unready.

SQLite has no server: every process on its file runs on one host, whose clock
is then the database's (``database_reader`` answers None).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

Clock = Callable[[], datetime]
Ticks = Callable[[], float]
log = logging.getLogger("topoplace.clock")

MEASURE_INTERVAL_S = 10.0  # how often the anchor is read again from the database
MAX_ROUND_TRIP_S = 0.5  # a slower read keeps the anchor before it (error <= half of it)
OFFSET_WARN_S = 1.0  # a host this far from the database's clock is logged


def database_reader(engine: sa.Engine) -> Clock | None:
    """The database server's clock, one query per read; None where the database has no
    clock of its own (SQLite: the host's is the database's)."""
    if engine.dialect.name != "postgresql":
        return None

    def read() -> datetime:
        with engine.connect() as conn:
            # clock_timestamp(), not now(): now() is the transaction's start.
            value = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()
        return _aware(value)

    return read


class DatabaseTime:
    """A clock that tells the database's time: ``read`` (a query) at the last
    ``measure``, plus what ``ticks`` (seconds, monotonic) counted since. ``host`` is this
    host's wall clock, read only to report how far it is from the database's."""

    def __init__(self, read: Clock, host: Clock, ticks: Ticks = time.monotonic) -> None:
        self._read = read
        self._host = host
        self._ticks = ticks
        self._lock = threading.Lock()
        self._anchor: tuple[datetime, float] | None = None  # (database time, ticks then)
        self.offset_s: float | None = None  # host minus database, at the last measure
        self._warned = False

    def __call__(self) -> datetime:
        anchor = self._anchor
        if anchor is None:
            self.measure()
            anchor = self._anchor
            assert anchor is not None
        at, ticked = anchor
        return at + timedelta(seconds=self._ticks() - ticked)

    def measure(self) -> None:
        """Read the database's clock again and anchor on it (first call: whatever the
        round trip; after it, only a read faster than ``MAX_ROUND_TRIP_S``)."""
        before = self._ticks()
        database = self._read()
        after = self._ticks()
        host = self._host()
        round_trip = after - before
        with self._lock:
            if self._anchor is not None and round_trip > MAX_ROUND_TRIP_S:
                log.info(
                    "database clock read took %.3f s; keeping the previous reading", round_trip
                )
                return
            # The database read its clock somewhere within the round trip: its middle.
            self._anchor = (database, (before + after) / 2)
            offset = (host - database).total_seconds() - round_trip / 2
            self.offset_s = offset
        self._report(offset)

    def _report(self, offset: float) -> None:
        """One warning when the host's clock moves past ``OFFSET_WARN_S`` from the
        database's, one line when it is back within it."""
        far = abs(offset) > OFFSET_WARN_S
        if far and not self._warned:
            log.warning(
                "this host's clock is %+.3f s from the database's; reservation TTLs, expiries"
                " and heartbeats are judged on the database's clock, but check the host's NTP",
                offset,
            )
        elif not far and self._warned:
            log.info("this host's clock is back within %.1f s of the database's", OFFSET_WARN_S)
        self._warned = far


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
