"""A transaction whose connection was lost at its end: memory read again from the database.

A connection lost while its COMMIT was on the way leaves the outcome unknown: the
server may have committed and its answer been lost. The caller still answers 503
(it cannot say which way it went), but memory must not wait for the next full
resync (30 s) to learn it: a release that committed left its GPUs held in memory,
and the client's retry, which finds nothing more to release, changed nothing there,
so /place was refused those GPUs meanwhile. Memory is read again at once (the
resync compares every node and syncs only the ones that differ); where the
database cannot be read either, the next resync does it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.exc import DBAPIError

from service.notify import Follower

log = logging.getLogger("topoplace.service")


@contextmanager
def following(state: Follower) -> Iterator[None]:
    """Around a write whose changes memory follows: on a lost connection, resync."""
    try:
        yield
    except DBAPIError as exc:
        if exc.connection_invalidated:
            try:
                state.resync()
            except DBAPIError:
                log.warning("memory not read again after a lost connection; the next resync will")
        raise
