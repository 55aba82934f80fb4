"""All SQL about allocations and the GPU holds that guard them.

Every state change is one conditional statement: ``UPDATE ... WHERE id IN
(...) AND <the transition's guard> RETURNING ...``. Whatever ran before it
(a read, another replica's write), the statement changes a row only if the
row is still in the state the transition starts from, and the database
serializes two statements on one row; so of two racing transitions at most
one happens, and the loser learns it from the rows it got back. The guards
are listed once, in ``GUARDS``, and docs/service.md draws the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service import schema

LIVE = schema.LIVE_STATES
_T = schema.allocations
_H = schema.gpu_holds


@dataclass(frozen=True, slots=True)
class FreedHold:
    """A hold deleted because its allocation ended."""

    allocation_id: str
    node: str
    device: str
    kind: str


def _expired(now: datetime) -> sa.ColumnElement[bool]:
    return sa.and_(_T.c.expires_at.is_not(None), _T.c.expires_at <= now)


def _unexpired(now: datetime) -> sa.ColumnElement[bool]:
    return sa.or_(_T.c.expires_at.is_(None), _T.c.expires_at > now)


Guard = Callable[[datetime], sa.ColumnElement[bool]]
# Transition -> the condition the row must meet when the statement runs.
GUARDS: dict[str, Guard] = {
    # pending (or degraded with a TTL) -> active / degraded without a TTL: bound in time
    "confirm": lambda now: sa.and_(_T.c.state.in_(("pending", "degraded")), _unexpired(now)),
    # a reservation's TTL moves, while it still has one and it has not passed
    "extend": lambda now: sa.and_(
        _T.c.state.in_(("pending", "degraded")), _T.c.expires_at.is_not(None), _unexpired(now)
    ),
    # any live allocation ends when released
    "release": lambda now: _T.c.state.in_(LIVE),
    # only an unconfirmed reservation whose TTL passed expires
    "expire": lambda now: sa.and_(_T.c.state.in_(("pending", "degraded")), _expired(now)),
}


def by_id(conn: Connection, allocation_id: str) -> sa.RowMapping | None:
    return conn.execute(sa.select(_T).where(_T.c.id == allocation_id)).mappings().first()


def by_idempotency_key(conn: Connection, key: str) -> sa.RowMapping | None:
    query = sa.select(_T).where(_T.c.idempotency_key == key)
    return conn.execute(query).mappings().first()


def confirm(conn: Connection, allocation_id: str, now: datetime) -> sa.RowMapping | None:
    """pending -> active (degraded stays degraded) and the TTL is dropped; the row, or
    None when the guard did not hold."""
    statement = (
        sa.update(_T)
        .where(_T.c.id == allocation_id, GUARDS["confirm"](now))
        .values(
            state=sa.case((_T.c.state == "pending", "active"), else_=_T.c.state),
            expires_at=None,
        )
        .returning(*_T.c)
    )
    return conn.execute(statement).mappings().first()


def extend(
    conn: Connection, allocation_id: str, now: datetime, expires_at: datetime
) -> sa.RowMapping | None:
    """A reservation's new expiry; the row, or None when the guard did not hold."""
    statement = (
        sa.update(_T)
        .where(_T.c.id == allocation_id, GUARDS["extend"](now))
        .values(expires_at=expires_at)
        .returning(*_T.c)
    )
    return conn.execute(statement).mappings().first()


def end(
    conn: Connection, allocation_ids: Sequence[str] | None, transition: str, now: datetime
) -> tuple[list[str], list[FreedHold]]:
    """End the allocations the transition's guard lets through (``None``: every row it
    does, for the sweep) and delete their holds; returns (ended ids, freed holds).

    The state change comes first: it takes the rows (Postgres locks them; on SQLite
    it starts the write), so the holds deleted next are exactly those of the rows it
    changed. The foreign keys are checked at commit, when both statements have run.
    """
    final = "expired" if transition == "expire" else "released"
    where = [GUARDS[transition](now)]
    if allocation_ids is not None:
        if not allocation_ids:
            return [], []
        where.append(_T.c.id.in_(list(allocation_ids)))
    statement = (
        sa.update(_T)
        .where(*where)
        .values(
            state=final,
            live=None,
            anchor_node=None,
            anchor_device=None,
            ended_at=now,
            expires_at=None,
        )
        .returning(_T.c.id)
    )
    ended = sorted(str(i) for i in conn.execute(statement).scalars())
    if not ended:
        return [], []
    deleted = conn.execute(
        sa.delete(_H)
        .where(_H.c.allocation_id.in_(ended))
        .returning(_H.c.allocation_id, _H.c.node, _H.c.device, _H.c.kind)
    ).all()
    return ended, [FreedHold(str(a), str(n), str(d), str(k)) for a, n, d, k in deleted]


def live_ids_for_job(conn: Connection, job_id: str) -> list[str]:
    query = sa.select(_T.c.id).where(_T.c.job_id == job_id, _T.c.state.in_(LIVE))
    return list(conn.execute(query).scalars())


def listing(
    conn: Connection, *, job_id: str | None, node: str | None, state: str | None, limit: int
) -> list[sa.RowMapping]:
    query = sa.select(_T).order_by(_T.c.created_at.desc(), _T.c.id).limit(limit)
    if job_id is not None:
        query = query.where(_T.c.job_id == job_id)
    if state is not None:
        query = query.where(_T.c.state == state)
    if node is not None:
        # The placement JSON names its nodes; holds only exist while live, so
        # match on the stored placement to find ended allocations too.
        # autoescape: % and _ in the name are the characters themselves, not wildcards.
        query = query.where(_T.c.placement.contains(f'"node": "{node}"', autoescape=True))
    return list(conn.execute(query).mappings().all())
