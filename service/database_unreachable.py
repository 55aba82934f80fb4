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
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError

from service.errors import Unavailable

log = logging.getLogger("topoplace.service")

MESSAGE = "the database did not answer; the service's log says why"
LOG_EVERY_S = 10.0

_clock: Callable[[], float] = time.monotonic  # a test's own clock may stand in
_lock = threading.Lock()
_last_logged: dict[str, float] = {}


def unavailable(exc: BaseException) -> Unavailable:
    """The refusal to answer for ``exc`` (a driver's error), its words logged."""
    reason = str(exc.orig if isinstance(exc, DBAPIError) else exc).strip()
    now = _clock()
    with _lock:
        due = now - _last_logged.get(reason, -LOG_EVERY_S) >= LOG_EVERY_S
        if due:
            if len(_last_logged) >= 100:  # a bound on words remembered, not on outages
                _last_logged.clear()
            _last_logged[reason] = now
    if due:
        log.warning("the database did not answer: %s", reason)
    return Unavailable(MESSAGE)
