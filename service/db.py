"""Database engine: one per process, SQLite tuned for a single embedded service."""

from __future__ import annotations

import random
import sqlite3
import time
from collections.abc import Callable
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

WAL_BACKSTOP_PAGES = 16_384  # 64 MiB of 4 KiB pages
# Postgres aborts one of two transactions that wait on each other (deadlock) or
# that it cannot serialize; either may simply run again, and the caller should
# never hear of it.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})
TRANSIENT_ATTEMPTS = 6
T = TypeVar("T")


def make_engine(database_url: str, idle_in_transaction_s: float = 0.0) -> Engine:
    """``idle_in_transaction_s``: Postgres ends a session idle this long inside a
    transaction (0: never; SQLite has no such sessions, its writers are one process)."""
    if database_url.startswith("sqlite"):
        engine = sa.create_engine(
            database_url, connect_args={"check_same_thread": False, "timeout": 30}
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            # Foreign keys are off by default in SQLite; WAL lets readers run during a write.
            cursor.execute("PRAGMA foreign_keys=ON")
            _wal(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            # A commit that crosses SQLite's checkpoint threshold (1,000 pages by
            # default) copies the WAL into the database and syncs it before
            # returning: 4-5 ms on one reservation in about a hundred, the filter's
            # p99 inside slurmctld. The service checkpoints from its background
            # loop instead (``checkpoint``); this higher threshold only bounds the
            # WAL where nothing does (a CLI command, a stalled loop).
            cursor.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_PAGES}")
            cursor.close()

        return engine
    # No pre-ping: it costs a round trip per request on the /place path; a
    # connection that died is recycled on its error and the request answers 503.
    engine = sa.create_engine(
        database_url,
        pool_size=10,
        max_overflow=10,
        pool_recycle=1800,
        connect_args={
            **postgres_connect_args(database_url),
            **_session_options(database_url, idle_in_transaction_s),
        },
    )
    # A session Postgres ended for idling in a transaction (SQLSTATE 25P03) is a
    # connection lost like any other, and answered so (503, gRPC UNAVAILABLE); psycopg
    # raises it as an InternalError (class 25, invalid transaction state), which every
    # caller took for a fault (500). Renamed here, the one place that SQLAlchemy and the
    # batch writer (service/allocations/batch_writer.py) both read.
    engine.dialect.dbapi_exception_translation_map = {
        **engine.dialect.dbapi_exception_translation_map,
        "IdleInTransactionSessionTimeout": "OperationalError",
    }
    return engine


def _session_options(database_url: str, idle_in_transaction_s: float) -> dict[str, str]:
    """A process frozen (SIGSTOP, a VM paused, a debugger) inside a transaction holds its
    row and advisory locks until its session ends, which without this timeout is never:
    every other replica's write of those rows waits. Postgres ends the session instead;
    the frozen process, thawed, answers 503 like any connection lost. Options the URL
    gives (``?options=-c ...``) are kept, before this one."""
    ms = round(idle_in_transaction_s * 1000)
    given = sa.make_url(database_url).query.get("options", "")
    given = given if isinstance(given, str) else " ".join(given)
    # UTC, after what the URL gives: a server, database or role whose TimeZone is another
    # hands timestamps back in its offset, and the API wrote "+05:30" where it documents
    # UTC with "Z" (service/allocations/encoding.py).
    options = [given, "-c TimeZone=UTC"]
    if ms > 0:
        options.append(f"-c idle_in_transaction_session_timeout={ms}")
    return {"options": " ".join(options).strip()}


# libpq waits for a connection without limit by default: a database host that
# accepts and never answers (a frozen server, a half-open proxy, a failover's old
# address) held `topoplace serve` at start, silent, for good, and each request that
# needed a new connection with it. Keepalives find a peer that vanished under an
# open connection (about 30 s + 3 x 10 s) instead of the kernel's two hours.
POSTGRES_CONNECT_DEFAULTS: dict[str, int] = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}


def postgres_connect_args(database_url: str) -> dict[str, int]:
    """libpq's connection limits, each unless the URL's query sets it
    (``...?connect_timeout=3``: the operator's word wins)."""
    given = sa.engine.make_url(database_url).query
    return {k: v for k, v in POSTGRES_CONNECT_DEFAULTS.items() if k not in given}


WAL_SWITCH_ATTEMPTS = 100  # 2 s in all


def _wal(cursor: Any) -> None:
    """Put the file in WAL mode, which it then keeps. Switching takes a lock SQLite does
    not wait for: two connections opening a new file at once (two engines, two
    processes starting) failed one of them with 'database is locked' at once, in 3 runs
    of 30 of a test racing two writers. So the mode is asked first (a file in WAL mode
    needs no switch) and a refused switch is tried again."""
    for _ in range(WAL_SWITCH_ATTEMPTS - 1):
        if str(cursor.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.02)
    cursor.execute("PRAGMA journal_mode=WAL")  # the last try: its error is the answer


def checkpoint(engine: Engine) -> tuple[int, int] | None:
    """Copy SQLite's write-ahead log into the database without blocking writers
    (PASSIVE); (frames in the log, frames copied), or None for other databases."""
    if engine.dialect.name != "sqlite":
        return None
    with engine.connect() as conn:
        _busy, logged, copied = conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)").one()
    return int(logged), int(copied)


def is_transient(exc: BaseException) -> bool:
    """A database error that running the same transaction again may not meet."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    return getattr(orig, "sqlstate", None) in TRANSIENT_SQLSTATES


def retry_transient(
    work: Callable[[], T],
    attempts: int = TRANSIENT_ATTEMPTS,
    retried: Callable[[], None] | None = None,
) -> T:
    """Run ``work`` (one whole transaction) again on a deadlock or serialization failure,
    after a short random pause so that the two losers do not meet again. ``retried`` is
    told of each new attempt (/metrics counts them)."""
    for attempt in range(attempts):
        try:
            return work()
        except DBAPIError as exc:
            if attempt == attempts - 1 or not is_transient(exc):
                raise
            if retried is not None:
                retried()
            time.sleep(random.uniform(0.0, 0.002 * 2**attempt))
    raise AssertionError("unreachable")


def in_transaction(
    engine: Engine,
    work: Callable[[Connection], T],
    retried: Callable[[], None] | None = None,
) -> T:
    """``work`` in one transaction, committed on return, retried when transient."""

    def once() -> T:
        with engine.begin() as conn:
            return work(conn)

    return retry_transient(once, retried=retried)
