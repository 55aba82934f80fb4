"""The audit log's SQL: write rows (inside the caller's transaction), read a page, prune.

Rows are written by the change they describe, in its transaction, so a
change and its row commit together or not at all; a refused request, whose
change did not happen, writes its row in a transaction of its own
(:func:`write_alone`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from service.audit import records
from service.schema import allocations, audit_log

_A = audit_log


def write(conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
    if rows:
        conn.execute(_A.insert(), [dict(r) for r in rows])


def written(conn: Connection, allocation_id: str, action: str, at: datetime) -> bool:
    """Whether a change's audit row, which commits with the change, is stored: the way to
    tell whether a transaction whose commit went unanswered committed (``at`` is its own
    moment, to the microsecond)."""
    query = sa.select(_A.c.id).where(
        _A.c.allocation_id == allocation_id, _A.c.action == action, _A.c.at == at
    )
    return conn.execute(query.limit(1)).first() is not None


def write_alone(engine: Engine, row: Mapping[str, Any]) -> None:
    """One row in a transaction of its own: what a refused request leaves."""
    with engine.begin() as conn:
        write(conn, [row])


def write_allocations(
    conn: Connection, action: str, allocation_ids: Sequence[str], at: datetime
) -> None:
    """One row per allocation, read as this transaction has just left it."""
    if not allocation_ids:
        return
    found = conn.execute(
        sa.select(allocations).where(allocations.c.id.in_(list(allocation_ids)))
    ).mappings()
    by_id = {str(r["id"]): r for r in found}
    write(conn, [records.allocation_change(action, at, by_id[i]) for i in allocation_ids])


@dataclass(frozen=True, slots=True)
class Filters:
    kind: str | None = None
    action: str | None = None
    actor_id: str | None = None
    node: str | None = None
    job_id: str | None = None
    allocation_id: str | None = None
    since: datetime | None = None  # at >= since
    until: datetime | None = None  # at < until

    def where(self) -> list[sa.ColumnElement[bool]]:
        out: list[sa.ColumnElement[bool]] = []
        equal = {
            "kind": self.kind,
            "action": self.action,
            "actor_id": self.actor_id,
            "job_id": self.job_id,
            "allocation_id": self.allocation_id,
        }
        out += [_A.c[column] == value for column, value in equal.items() if value is not None]
        if self.node is not None:
            escaped = self.node.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            out.append(_A.c.nodes.like(f"%,{escaped},%", escape="\\"))
        if self.since is not None:
            out.append(_A.c.at >= self.since)
        if self.until is not None:
            out.append(_A.c.at < self.until)
        return out


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[sa.RowMapping]
    next_cursor: int | None  # the ``before`` of the next page; None on the last


def page(engine: Engine, filters: Filters, limit: int, before: int | None = None) -> Page:
    """Newest first: up to ``limit`` rows matching ``filters`` with an id under ``before``."""
    where = filters.where()
    if before is not None:
        where.append(_A.c.id < before)
    query = sa.select(_A).where(*where).order_by(_A.c.id.desc()).limit(limit + 1)
    with engine.connect() as conn:
        rows = list(conn.execute(query).mappings())
    if len(rows) > limit:
        rows = rows[:limit]
        return Page(rows, int(rows[-1]["id"]))
    return Page(rows, None)


def prune(engine: Engine, before: datetime, batch: int) -> int:
    """Delete the oldest ``batch`` rows older than ``before``, in one transaction; how
    many went (``batch``: more may be due)."""
    with engine.begin() as conn:
        oldest = sa.select(_A.c.id).where(_A.c.at < before).order_by(_A.c.id).limit(batch)
        ids = list(conn.execute(oldest).scalars())
        if ids:
            conn.execute(sa.delete(_A).where(_A.c.id.in_(ids)))
    return len(ids)
