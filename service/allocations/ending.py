"""Ending allocations by a transition's guard (release, expire), and memory following.

Shared by the lifecycle (release, the sweep) and the /place flow (a replay that finds
its reservation past its TTL expires it, as the sweep would): one transaction ends the
rows the guard lets through, deletes their holds, tells the other replicas and writes
the audit rows; memory is then read back from the database.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

from service.allocations import repository
from service.allocations.results import Ended
from service.audit import records
from service.audit import store as audit
from service.db import in_transaction
from service.lost_commit import following
from service.notify import publish
from service.state import ServiceState

RELEASE_CHUNK = 64  # nodes freed per hold of the state lock when many reservations end


def end(
    state: ServiceState, ids: list[str] | None, transition: str, quiet: datetime | None = None
) -> Ended:
    """End what the transition's guard lets through (and, with ``quiet``, only what was
    neither made nor reused after it); memory follows the database."""
    now = state.clock()
    try:
        with following(state):  # a commit answer lost: memory reads what the database says
            ended, freed = in_transaction(
                state.engine,
                lambda conn: ending(conn, ids, transition, now, quiet),
                state.metrics.retried,
            )
    except DBAPIError as exc:
        landed = _landed(state, ids, transition, now) if exc.connection_invalidated else []
        if not landed:
            raise
        # Committed, its answer lost with the connection: answered (and told to watchers)
        # as made, not 503 while the retry finds nothing left to end and says nothing.
        return Ended(tuple(landed))
    forget(state, freed)
    return Ended(tuple(ended))


def _landed(
    state: ServiceState, ids: list[str] | None, transition: str, now: datetime
) -> list[str]:
    """What the unanswered transaction ended, read on a new connection; [] when nothing
    or when the database cannot say (the error stands). Memory was read already."""
    try:
        with state.engine.connect() as conn:
            return repository.ended_by(conn, ids, transition, now)
    except DBAPIError:
        return []


def ending(
    conn: Connection,
    ids: list[str] | None,
    transition: str,
    now: datetime,
    quiet: datetime | None = None,
) -> tuple[list[str], list[repository.FreedHold]]:
    """``end``'s work, in the caller's transaction."""
    rows, freed = repository.end_rows(conn, ids, transition, now, quiet)
    publish(conn, {h.node for h in freed})
    action = "expired" if transition == "expire" else "released"
    audit.write(conn, [records.allocation_change(action, now, row) for row in rows])
    return [str(row["id"]) for row in rows], freed


def forget(state: ServiceState, freed: list[repository.FreedHold]) -> None:
    """Make memory match the database on the nodes whose holds were deleted.

    Read back, not freed blindly: between the commit and this step another replica
    may already have taken a freed GPU (and this process synced it as held), so only
    the database can say what is free now. Chunked: a sweep can end hundreds of
    reservations, and /place waits for the lock meanwhile.
    """
    nodes = sorted({h.node for h in freed})
    for start in range(0, len(nodes), RELEASE_CHUNK):
        state.sync_nodes(nodes[start : start + RELEASE_CHUNK])
