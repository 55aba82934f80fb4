"""What a caller is told when the database does not answer, and what the log is told.

The driver's words name the database's host, port, name and user ("connection
to server at "db.internal", port 5432 failed: FATAL: password authentication
failed for user "topoplace""). /readyz is open to anyone, and a token the
process has not seen yet is looked up before its caller is known, so those
words would reach whoever asks. Every answer says only that the database did
not answer (503 ``database_unavailable`` with ``Retry-After``, or gRPC
UNAVAILABLE), in words that do not change; the driver's words go to the
service's log, where the operator reads them. The same words are logged at
most once per ``LOG_EVERY_S``: during an outage every request meets them.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.errors import DatabaseFull, ServiceError, Unavailable
from service.log_gate import LOG_EVERY_S, LogGate

log = logging.getLogger("topoplace.service")

MESSAGE = "the database did not answer; the service's log says why"
FULL_MESSAGE = (
    "the database has no space left to write (its disk is full, or SQLite's"
    " max_page_count is reached); nothing was written: free space on the database's"
    " disk, then retry"
)
# SQLite's SQLITE_FULL; Postgres's disk_full (class 53, insufficient resources).
_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"

# What a caller is told the database did not answer for: the driver's lost or refused
# connection, or no connection of the pool free within its wait (30 s: every one held by
# requests in flight; FastAPI runs 40 at once on 15 or 20 connections). The second was
# known to no handler and answered 500 internal_error, a fault, for an overload.
NOT_ANSWERING: tuple[type[OperationalError], type[PoolTimeout]] = (OperationalError, PoolTimeout)

_logged = LogGate(LOG_EVERY_S)  # a test's own gate (and clock) may stand in


def unavailable(exc: BaseException) -> ServiceError:
    """The refusal to answer for ``exc`` (a driver's error), its words logged: 507
    ``database_full`` where the database said it has no room, else 503."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    reason = str(orig).strip()
    due = _logged.due(reason) is not None
    if _full(orig):
        if due:
            log.warning("the database has no space to write: %s", reason)
        return DatabaseFull(FULL_MESSAGE)
    if due:
        log.warning("the database did not answer: %s", reason)
    return Unavailable(MESSAGE)


def _full(orig: object) -> bool:
    """Whether the driver's error says the database has no room (not that it is gone)."""
    code = getattr(orig, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == _SQLITE_FULL:  # primary code of an extended one
        return True
    return getattr(orig, "sqlstate", None) == _PG_DISK_FULL
