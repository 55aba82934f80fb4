"""Reading allocations: one by id, a filtered listing, several by id (for events)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from service.allocations import repository, views
from service.allocations.results import Allocation
from service.errors import NotFound
from service.state import ServiceState


def get(state: ServiceState, allocation_id: str) -> Allocation:
    with state.engine.connect() as conn:
        row = repository.by_id(conn, allocation_id)
    if row is None:
        raise NotFound(f"no allocation {allocation_id!r}")
    return views.allocation(row)


def listing(
    state: ServiceState, job_id: str | None, node: str | None, status: str | None, limit: int
) -> list[Allocation]:
    with state.engine.connect() as conn:
        rows = repository.listing(conn, job_id=job_id, node=node, state=status, limit=limit)
    return [views.allocation(r) for r in rows]


def count_for_job(state: ServiceState, job_id: str) -> int:
    """How many allocations, live or ended, ever carried ``job_id``: unlike a listing,
    not capped."""
    with state.engine.connect() as conn:
        return repository.count_for_job(conn, job_id)


def by_ids(state: ServiceState, allocation_ids: Sequence[str]) -> list[Allocation]:
    """These allocations as they are now, in the order asked; unknown ids are left out."""
    if not allocation_ids:
        return []
    with state.engine.connect() as conn:
        rows = {str(r["id"]): r for r in repository.by_ids(conn, allocation_ids)}
    return [views.allocation(rows[i]) for i in allocation_ids if i in rows]


def live_keyed_under(state: ServiceState, prefix: str) -> list[Allocation]:
    """The live allocations made under keys that start with ``prefix``."""
    with state.engine.connect() as conn:
        rows = repository.live_keyed_under(conn, prefix)
    return [views.allocation(r) for r in rows]


def live(state: ServiceState) -> list[Allocation]:
    """Every live allocation (pending, active, degraded), however many."""
    with state.engine.connect() as conn:
        rows = repository.live_rows(conn)
    return [views.allocation(r) for r in rows]


def used_since(state: ServiceState, allocation_ids: Sequence[str], since: datetime) -> set[str]:
    """Those of these allocations made or reused (``touch``: a retried bind, a report of
    their job's start) after ``since``: a view of them older than that (a reconciler's)
    cannot speak for them. Not part of an allocation's view, so read on its own."""
    if not allocation_ids:
        return set()
    with state.engine.connect() as conn:
        rows = repository.by_ids(conn, allocation_ids)
    return {
        str(r["id"])
        for r in rows
        if any(t is not None and views.aware(t) > since for t in (r["created_at"], r["touched_at"]))
    }
