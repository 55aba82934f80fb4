"""The allocation lifecycle after /place: confirm, extend, release, expire, and a
scheduler's truth (attach, observe). docs/service.md draws the state machine.

Each change is one transaction whose guards live in repository.py; memory
follows the database afterwards (``_forget``). These functions say what they
changed and publish nothing: the allocations API (api.py) turns each change
into exactly one event, whoever asked for it, and each such change writes
its one audit row (service/audit/) in its own transaction, so the database
never holds a change without its row or a row without its change.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from service.allocations import queries, repository, views
from service.allocations.encoding import time_text
from service.allocations.observed_gpus import observed_placement
from service.allocations.place_flow import checked_ttl
from service.allocations.results import Allocation, Ended, Observation
from service.allocations.schemas import PlaceRequest
from service.audit import records
from service.audit import store as audit
from service.db import in_transaction
from service.errors import BadRequest, Conflict, NotFound, ServiceError
from service.notify import publish
from service.state import ServiceState

RELEASE_CHUNK = 64  # nodes freed per hold of the state lock when many reservations end
OBSERVE_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class Transition:
    """What a confirm or an extend did.

    ``allocation``: the allocation as the transaction left it (None for an unknown
    id); ``changed``: whether the transition happened (a repeated confirm is answered
    unchanged); ``expired``: the TTL was found passed, and the reservation expired
    then and there (kept, not rolled back with the refusal); ``refusal``: what to
    raise once the transaction has committed."""

    allocation: Allocation | None
    changed: bool
    expired: bool = False
    refusal: ServiceError | None = None


@dataclass(frozen=True, slots=True)
class _Outcome:
    row: Mapping[Any, Any] | None
    changed: bool
    freed: list[repository.FreedHold]
    expired: bool = False
    refusal: ServiceError | None = None


def _transition(state: ServiceState, work: Callable[[Connection], _Outcome]) -> Transition:
    outcome = in_transaction(state.engine, work, state.metrics.retried)
    _forget(state, outcome.freed)
    allocation = None if outcome.row is None else views.allocation(outcome.row)
    return Transition(allocation, outcome.changed, outcome.expired, outcome.refusal)


def _refused(conn: Connection, allocation_id: str, now: datetime, verb: str) -> _Outcome:
    """Why the guard of ``verb`` did not hold; a reservation found past its TTL is
    expired here and then, so the answer and the database say the same."""
    row = repository.by_id(conn, allocation_id)
    if row is None:
        return _Outcome(None, False, [], refusal=NotFound(f"no allocation {allocation_id!r}"))
    freed: list[repository.FreedHold] = []
    expired = False
    if row["state"] in ("pending", "degraded") and row["expires_at"] is not None:
        # The guard failed on a live reservation with a TTL: the TTL has passed.
        _, freed = repository.end(conn, [allocation_id], "expire", now)
        publish(conn, {h.node for h in freed})
        row = repository.by_id(conn, allocation_id)
        assert row is not None
        audit.write(conn, [records.allocation_change("expired", now, row)])
        expired = True
        message = (
            f"allocation {allocation_id} expired at {time_text(views.aware(row['ended_at']))}:"
            " its TTL passed"
            f" before the {verb}; place the job again"
        )
    elif verb == "extend" and row["state"] in ("active", "degraded"):
        message = f"allocation {allocation_id} is {row['state']}; only a pending one has a TTL"
    else:
        message = (
            f"allocation {allocation_id} is {row['state']}; only a pending one can be {verb}ed"
        )
    refusal = Conflict(message, {"state": row["state"]})
    return _Outcome(row, False, freed, expired, refusal)


def confirm(state: ServiceState, allocation_id: str) -> Transition:
    """pending -> active (degraded stays degraded, without a TTL); confirming again is
    answered unchanged; a reservation whose TTL passed is expired and refused."""
    now = state.clock()

    def work(conn: Connection) -> _Outcome:
        row = repository.confirm(conn, allocation_id, now)
        if row is not None:
            audit.write(conn, [records.allocation_change("confirmed", now, row)])
            return _Outcome(row, True, [])
        current = repository.by_id(conn, allocation_id)
        # Confirmed before (active, or degraded without a TTL): the same answer again.
        already = current is not None and current["state"] in ("active", "degraded")
        if already and current is not None and current["expires_at"] is None:
            return _Outcome(current, False, [])
        return _refused(conn, allocation_id, now, "confirm")

    return _transition(state, work)


def extend(state: ServiceState, allocation_id: str, ttl_s: float) -> Transition:
    ttl = checked_ttl(state, ttl_s)
    now = state.clock()

    def work(conn: Connection) -> _Outcome:
        row = repository.extend(conn, allocation_id, now, now + timedelta(seconds=ttl))
        if row is not None:
            audit.write(conn, [records.allocation_change("extended", now, row)])
            return _Outcome(row, True, [])
        return _refused(conn, allocation_id, now, "extend")

    return _transition(state, work)


def _end(state: ServiceState, ids: list[str] | None, transition: str) -> Ended:
    """End what the transition's guard lets through; memory follows the database."""
    now = state.clock()

    def work(conn: Connection) -> tuple[list[str], list[repository.FreedHold]]:
        rows, freed = repository.end_rows(conn, ids, transition, now)
        publish(conn, {h.node for h in freed})
        action = "expired" if transition == "expire" else "released"
        audit.write(conn, [records.allocation_change(action, now, row) for row in rows])
        return [str(row["id"]) for row in rows], freed

    ended, freed = in_transaction(state.engine, work, state.metrics.retried)
    _forget(state, freed)
    return Ended(tuple(ended))


def _forget(state: ServiceState, freed: list[repository.FreedHold]) -> None:
    """Make memory match the database on the nodes whose holds were deleted.

    Read back, not freed blindly: between the commit and this step another replica
    may already have taken a freed GPU (and this process synced it as held), so only
    the database can say what is free now. Chunked: a sweep can end hundreds of
    reservations, and /place waits for the lock meanwhile.
    """
    nodes = sorted({h.node for h in freed})
    for start in range(0, len(nodes), RELEASE_CHUNK):
        state.sync_nodes(nodes[start : start + RELEASE_CHUNK])


def release(state: ServiceState, allocation_id: str) -> Ended:
    """End one live allocation; releasing an ended one is a no-op, an unknown id a 404."""
    ended = _end(state, [allocation_id], "release")
    if not ended.ids:
        queries.get(state, allocation_id)  # 404 for an unknown id
    return ended


def release_job(state: ServiceState, job_id: str) -> Ended:
    with state.engine.connect() as conn:
        ids = repository.live_ids_for_job(conn, job_id)
    return _end(state, ids, "release")


def sweep(state: ServiceState) -> Ended:
    """Expire reservations whose TTL passed and that nobody confirmed."""
    return _end(state, None, "expire")


def attach(state: ServiceState, allocation_ids: list[str], job_id: str) -> tuple[str, ...]:
    """The scheduler's job id on live allocations that have none; the ids changed."""
    if not allocation_ids:
        return ()
    now = state.clock()

    def work(conn: Connection) -> list[str]:
        attached = repository.attach(conn, allocation_ids, job_id, now)
        audit.write_allocations(conn, "attached", attached, now)
        return attached

    return tuple(in_transaction(state.engine, work, state.metrics.retried))


def observe(
    state: ServiceState,
    job_id: str,
    owner: str,
    gpus: dict[str, list[int]],
    named: list[str],
    reason: str,
) -> Observation:
    """The scheduler runs ``job_id`` on ``gpus`` (node -> indices): make it so here.

    The job's live allocations are those carrying its id or ``named`` by it. When
    they hold exactly these GPUs, they only learn the job id. Otherwise the truth
    wins, in one transaction: any other allocation holding one of these GPUs is
    stale (the scheduler would not run two jobs on one GPU) and is released; the
    job's first allocation is relocated onto these GPUs (its others end), or one
    is created. A hold taken meanwhile by another replica fails the insert; the
    whole transaction is then tried again.
    """
    with state.lock:
        missing = [n for n in gpus if n not in state.cluster]
        if missing:
            raise NotFound(f"node(s) {', '.join(sorted(missing))} unknown to topoplace")
        snapshots = {n: state.cluster.node(n).snapshot for n in gpus}
    for node, indices in gpus.items():
        wrong = [i for i in indices if not 0 <= i < snapshots[node].gpu_count]
        if wrong or not indices:
            raise BadRequest(f"{node} has no GPU {wrong or '(none named)'}", {"node": node})
    holds = [(n, snapshots[n].gpus[i].uuid, "gpu") for n in sorted(gpus) for i in sorted(gpus[n])]
    wanted = {(n, d) for n, d, _ in holds}
    placement_text = json.dumps(observed_placement(snapshots, gpus, reason))

    def work(conn: Connection) -> tuple[Observation, list[repository.FreedHold]]:
        now = state.clock()
        rows = repository.live_for_job(conn, job_id, named)
        ids = [str(r["id"]) for r in rows]
        if ids and repository.holds_of(conn, ids) == wanted:
            attached = tuple(repository.attach(conn, ids, job_id, now))
            if attached:
                audit.write_allocations(conn, "attached", attached, now)
                return Observation("attached", ids[0], attached=attached), []
            return Observation("matched", ids[0]), []
        stale = sorted(a for a in repository.holders(conn, sorted(wanted)) if a not in ids)
        superseded, freed = repository.end(conn, stale, "release", now)
        merged, freed_merged = repository.end(conn, ids[1:], "release", now)
        freed += freed_merged
        moved = None
        if ids:
            moved, given_up = repository.relocate(
                conn, ids[0], now, job_id=job_id, placement=placement_text, holds=holds
            )
            freed += given_up
        # Audit rows in the events' order (api.observe): what ended, then the job's own.
        audit.write_allocations(conn, "released", [*superseded, *merged], now)
        if moved is not None:
            observation = Observation("moved", ids[0], tuple(superseded), tuple(merged))
            audit.write(conn, [records.allocation_change("moved", now, moved)])
        else:
            row = _observed_row(job_id, owner, gpus, placement_text, holds, now)
            repository.insert(conn, row, holds)
            observation = Observation("created", str(row["id"]), tuple(superseded), tuple(merged))
            placed = records.placed(
                now, str(row["id"]), job_id, gpus, "active", str(row["request"]), placement_text
            )
            audit.write(conn, [placed])
        publish(conn, {h.node for h in freed} | set(gpus))
        return observation, freed

    for attempt in range(OBSERVE_ATTEMPTS):
        try:
            observation, freed = in_transaction(state.engine, work, state.metrics.retried)
            break
        except IntegrityError:
            if attempt == OBSERVE_ATTEMPTS - 1:
                raise Conflict(
                    f"the GPUs of job {job_id} kept being taken while it was recorded; retry",
                    {"job_id": job_id},
                ) from None
    if observation.action not in ("matched", "attached"):
        state.sync_nodes(sorted({h.node for h in freed} | set(gpus)))
    return observation


def _observed_row(
    job_id: str,
    owner: str,
    gpus: dict[str, list[int]],
    placement_text: str,
    holds: list[tuple[str, str, str]],
    now: datetime,
) -> dict[str, Any]:
    counts = {len(v) for v in gpus.values()}
    request = PlaceRequest(
        gpus=max(counts), tasks=len(gpus), owner=owner, job_id=job_id
    ).model_dump_json()
    return {
        "id": str(uuid.uuid4()),
        "state": "active",  # the job runs: no TTL, it ends with the job
        "job_id": job_id,
        "owner": owner,
        "idempotency_key": None,
        "request": request,
        "placement": placement_text,
        "created_at": now,
        "expires_at": None,
        "ended_at": None,
        "live": True,
        "anchor_node": holds[0][0],
        "anchor_device": holds[0][1],
    }
