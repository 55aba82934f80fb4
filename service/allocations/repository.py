"""All SQL about allocations and the GPU holds that guard them."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service import schema

LIVE = ("pending", "active", "degraded")


def by_id(conn: Connection, allocation_id: str) -> sa.RowMapping | None:
    table = schema.allocations
    return conn.execute(sa.select(table).where(table.c.id == allocation_id)).mappings().first()


def by_idempotency_key(conn: Connection, key: str) -> sa.RowMapping | None:
    table = schema.allocations
    query = sa.select(table).where(table.c.idempotency_key == key)
    return conn.execute(query).mappings().first()


def holds_of(conn: Connection, allocation_ids: list[str]) -> list[sa.RowMapping]:
    table = schema.gpu_holds
    query = sa.select(table).where(table.c.allocation_id.in_(allocation_ids))
    return list(conn.execute(query).mappings().all())


def end(conn: Connection, allocation_ids: list[str], state: str, now: datetime) -> list[str]:
    """Mark live allocations ended and drop their holds; returns the ids that were live."""
    table = schema.allocations
    live = list(
        conn.execute(
            sa.select(table.c.id).where(table.c.id.in_(allocation_ids), table.c.state.in_(LIVE))
        ).scalars()
    )
    if live:
        conn.execute(
            sa.update(table)
            .where(table.c.id.in_(live))
            .values(state=state, ended_at=now, expires_at=None)
        )
        conn.execute(sa.delete(schema.gpu_holds).where(schema.gpu_holds.c.allocation_id.in_(live)))
    return live


def live_ids_for_job(conn: Connection, job_id: str) -> list[str]:
    table = schema.allocations
    query = sa.select(table.c.id).where(table.c.job_id == job_id, table.c.state.in_(LIVE))
    return list(conn.execute(query).scalars())


def expired_ids(conn: Connection, now: datetime) -> list[str]:
    table = schema.allocations
    query = sa.select(table.c.id).where(table.c.state == "pending", table.c.expires_at < now)
    return list(conn.execute(query).scalars())


def set_state(
    conn: Connection, allocation_id: str, state: str, expires_at: datetime | None
) -> None:
    table = schema.allocations
    conn.execute(
        sa.update(table)
        .where(table.c.id == allocation_id)
        .values(state=state, expires_at=expires_at)
    )


def listing(
    conn: Connection, *, job_id: str | None, node: str | None, state: str | None, limit: int
) -> list[sa.RowMapping]:
    table = schema.allocations
    query = sa.select(table).order_by(table.c.created_at.desc(), table.c.id).limit(limit)
    if job_id is not None:
        query = query.where(table.c.job_id == job_id)
    if state is not None:
        query = query.where(table.c.state == state)
    if node is not None:
        # The placement JSON names its nodes; holds only exist while live, so
        # match on the stored placement to find ended allocations too.
        # autoescape: % and _ in the name are the characters themselves, not wildcards.
        query = query.where(table.c.placement.contains(f'"node": "{node}"', autoescape=True))
    return list(conn.execute(query).mappings().all())
