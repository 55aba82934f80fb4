"""The allocation operations as both transports call them: the service layer,
plus one event per change for watchers (service/events.py).

Kept apart from service.py so that the decision and commit path stays as it
is; publishing is skipped when nobody watches.
"""

from __future__ import annotations

from typing import Any

from service.allocations import service
from service.allocations.schemas import PlaceRequest
from service.allocations.service import get, listing, score, score_json
from service.state import ServiceState

__all__ = [
    "confirm",
    "extend",
    "get",
    "listing",
    "place",
    "place_async",
    "release",
    "release_job",
    "score",
    "score_json",
    "sweep",
]


def place(
    state: ServiceState, body: PlaceRequest, idempotency_key: str | None
) -> tuple[dict[str, Any], bool]:
    allocation, created = service.place(state, body, idempotency_key)
    if created:
        state.events.publish("allocation", "placed", allocation=allocation)
    return allocation, created


async def place_async(
    state: ServiceState, body: PlaceRequest, idempotency_key: str | None, active: bool = False
) -> tuple[dict[str, Any], bool]:
    allocation, created = await service.place_async(state, body, idempotency_key, active)
    if created:
        state.events.publish("allocation", "placed", allocation=allocation)
    return allocation, created


def confirm(state: ServiceState, allocation_id: str) -> dict[str, Any]:
    allocation = service.confirm(state, allocation_id)
    state.events.publish("allocation", "confirmed", allocation=allocation)
    return allocation


def extend(state: ServiceState, allocation_id: str, ttl_s: float) -> dict[str, Any]:
    allocation = service.extend(state, allocation_id, ttl_s)
    state.events.publish("allocation", "extended", allocation=allocation)
    return allocation


def _ended(state: ServiceState, type_: str, ids: list[str]) -> list[str]:
    if ids and state.events.watched:
        state.events.allocations(type_, [get(state, i) for i in ids])
    return ids


def release(state: ServiceState, allocation_id: str) -> list[str]:
    return _ended(state, "released", service.release(state, allocation_id))


def release_job(state: ServiceState, job_id: str) -> list[str]:
    return _ended(state, "released", service.release_job(state, job_id))


def sweep(state: ServiceState) -> list[str]:
    return _ended(state, "expired", service.sweep(state))
