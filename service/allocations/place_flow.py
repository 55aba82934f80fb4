"""/place: choose in memory, reserve in the database, never twice.

The write path (style: snapshot in, plan out, commit optimistically):

1. under the state lock, the engine chooses and the choice is applied to the
   in-memory state at once, so concurrent requests in this process see it;
2. the allocation and one ``gpu_holds`` row per GPU are inserted in one
   transaction (shared with concurrent reservations: group_commit.py); the
   holds' primary key makes a GPU held twice impossible at the database
   level, whichever process or replica wrote first;
3. if the insert fails on a hold, another replica got there first: the
   tentative choice is undone, that replica's holds are read into memory and
   the decision is made again on fresh state (a few times, then 409). Each hold
   names the seq of its node's snapshot the choice was made on, with a foreign
   key to the node row (service/schema.py): a snapshot report that replaced it
   meanwhile (a GPU lost, unhealthy or split into MIG instances), here or on
   another replica, fails the commit the same way, and the decision is made
   again on the stored snapshot. So does a cordon, or a node deleted and
   reported again under its old seq: each hold also names the snapshot's
   reported_at and its node uncordoned (``gpu_holds.node_reported_at``,
   ``node_cordoned``), so a replica that has not heard of a cordon places
   nothing there once the cordon has answered.

An ``Idempotency-Key`` is stored with the allocation (unique), so a retried
request gets the same allocation back, never a second one.

The flow is written once, as a generator that yields each step that waits on
the database (service/flows.py); a driver runs those steps. The thread
driver (``run``) blocks on them: gRPC and the Kubernetes bind run in worker
threads. The asyncio driver (``run_async``) awaits them, so REST
/place and the Slurm filter decide on the event loop (a fraction of a
millisecond) and wait for the group commit without a thread per request:
under load, handing every request to a worker thread and back cost more CPU
than the decision itself. A caller with a flow of its own (the Slurm filter)
takes these steps with ``yield from`` and is driven once, by the same driver.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy.exc import IntegrityError, OperationalError, SQLAlchemyError

from placement import Outcome, Placement
from placement.cluster import share_milli
from service.allocations import ending, repository, views
from service.allocations.results import Allocation, Placed
from service.allocations.schemas import PlaceRequest
from service.allocations.stored_request import same_request
from service.audit import actor as audit_actor
from service.audit import records
from service.audit import store as audit_store
from service.database_unreachable import unavailable
from service.edge import revoked_meanwhile
from service.errors import (
    BadRequest,
    Conflict,
    KeyInFlight,
    ServiceError,
    Unresolvable,
    Unschedulable,
)
from service.event_loop import off_loop
from service.flows import drive, drive_async
from service.state import ServiceState, cpu_device

PLACE_ATTEMPTS = 4
log = logging.getLogger("topoplace.place")

Blocking = Callable[[], Any]  # a step run as it is: blocking, or in a worker thread


@dataclass(frozen=True, slots=True)
class Commit:
    """A step: the reservation's row, holds, shares and audit row, for the group committer."""

    row: dict[str, Any]
    holds: list[tuple[str, str, str]]
    nodes: tuple[str, ...]
    audit: dict[str, Any]
    shares: list[tuple[str, str, int]]
    seqs: dict[str, int]  # node -> the seq of the snapshot the choice was made on
    reported: dict[str, datetime]  # node -> that snapshot's reported_at (state.reported)


Step = Blocking | Commit
# Raises where the reservation's answer cannot reach the caller (place_flow).
AnswerCheck = Callable[[Allocation], None]
Result = TypeVar("Result")
Flow = Generator[Step, Any, Result]


def blocking_step(state: ServiceState, at_once: bool, step: Step) -> Any:
    if isinstance(step, Commit):
        return state.committer.commit(
            step.row,
            step.holds,
            step.nodes,
            step.audit,
            at_once=at_once,
            shares=step.shares,
            seqs=step.seqs,
            reported=step.reported,
        )
    return step()


async def awaited_step(state: ServiceState, at_once: bool, step: Step) -> Any:
    if isinstance(step, Commit):
        return await state.committer.commit_async(
            step.row,
            step.holds,
            step.nodes,
            step.audit,
            at_once=at_once,
            shares=step.shares,
            seqs=step.seqs,
            reported=step.reported,
        )
    return await off_loop(step)


def run(state: ServiceState, flow: Flow[Result], at_once: bool = False) -> Result:
    """Drive a flow of these steps blocking on each (a worker thread). ``at_once``: as
    for ``run_async``; on a worker thread the write at once breaks no rule of the loop."""
    return drive(flow, functools.partial(blocking_step, state, at_once))


async def run_async(state: ServiceState, flow: Flow[Result], at_once: bool = False) -> Result:
    """Drive a flow of these steps on the event loop, awaiting each. ``at_once``: the
    caller is alone by construction (the Slurm filter, called by slurmctld one job at a
    time), so its reservations are written at once where the database allows it instead
    of handed to the group committer's thread (group_commit.py)."""
    return await drive_async(flow, functools.partial(awaited_step, state, at_once))


def holds_of(placement: Placement) -> list[tuple[str, str, str]]:
    """(node, device, kind) rows for gpu_holds. CPUs reserved with ``cpus_per_task``
    are held the same way (device ``cpu:N``), so they too are exclusive at the
    database level and every replica learns of them."""
    out: list[tuple[str, str, str]] = []
    for task in placement.tasks:
        if task.mig_uuids:
            out += [(task.node, m, "mig") for m in task.mig_uuids]
        elif task.gpu_fraction is None:  # a share's GPU is held by its pool (shares_of)
            out += [(task.node, g, "gpu") for g in task.gpu_uuids]
        out += [(task.node, cpu_device(c), "cpu") for c in task.cpus]
    return out


def shares_of(placement: Placement) -> list[tuple[str, str, int]]:
    """(node, device, thousandths) rows for gpu_shares: a share task's one GPU."""
    return [
        (task.node, task.gpu_uuids[0], share_milli(task.gpu_fraction))
        for task in placement.tasks
        if task.gpu_fraction is not None
    ]


def refusal(outcome: Outcome) -> ServiceError:
    detail = {
        "reasons": [
            {
                "cause": g.cause.value,
                "nodes": g.nodes,
                "message": g.message,
                "resolvable": g.resolvable,
            }
            for g in outcome.reasons
        ]
    }
    message = outcome.summary()
    if outcome.status == "unresolvable":
        return Unresolvable(f"the cluster can never hold this request: {message}", detail)
    return Unschedulable(f"nothing fits now: {message}", detail)


def checked_ttl(state: ServiceState, requested: float | None) -> float:
    ttl = state.settings.reservation_ttl_s if requested is None else requested
    if not ttl >= state.settings.min_reservation_ttl_s:  # NaN is refused too
        raise BadRequest(
            f"ttl_s {ttl:g} is under the minimum of {state.settings.min_reservation_ttl_s:g}"
            " seconds (TOPOPLACE_MIN_RESERVATION_TTL_S)",
            {"field": "ttl_s"},
        )
    if ttl > state.settings.max_reservation_ttl_s:
        raise BadRequest(
            f"ttl_s {ttl:g} is over the limit of {state.settings.max_reservation_ttl_s:g} seconds",
            {"field": "ttl_s"},
        )
    return ttl


def place_flow(
    state: ServiceState,
    body: PlaceRequest,
    idempotency_key: str | None,
    active: bool,
    replay_first: bool = True,
    answerable: AnswerCheck | None = None,
) -> Flow[Placed]:
    """Choose and reserve. ``active``: active at once instead of pending until confirmed,
    for a scheduler that owns the job from the answer on (Slurm). ``replay_first=False``:
    the caller expects the key to be new (a bind's first reservation), so the read that
    looks for an earlier use is skipped; the key's unique index still refuses a reuse
    at the commit, and that reservation is then replayed (or refused) as it would be
    here. ``answerable``: raises where the caller cannot deliver this answer (gRPC's
    receive limit), called before the commit, so the choice is undone, not held."""
    request_json = body.model_dump_json()
    if idempotency_key is not None and replay_first:
        replay = yield functools.partial(_replay, state, idempotency_key, request_json)
        if isinstance(replay, Placed):  # None: the key is new
            return replay
    ttl = checked_ttl(state, body.ttl_s)
    for _ in range(PLACE_ATTEMPTS):
        allocation_id = str(uuid.uuid4())
        with state.lock:
            # After the wait for the lock, before anything is chosen: a caller's token
            # revoked meanwhile reserves nothing (service/edge/revoked_meanwhile.py).
            revoked_meanwhile.refuse_if_revoked()
            state.refresh_if_due()
            outcome = state.cluster.place(body)  # a PlacementRequest; owner and TTL stay here
            placement = outcome.placement
            if placement is not None:
                state.cluster.apply(placement)  # tentative: concurrent ones here skip these GPUs
                holds, shares = holds_of(placement), shares_of(placement)
                devices = [(node, device) for node, device, _ in holds]
                host = [(t.node, t.cpu_milli, t.memory_mib) for t in placement.tasks]
                state.begin_inflight(devices, shares, allocation_id, idempotency_key, host)
                # The snapshots chosen on: the commit holds only while they are stored,
                # and the nodes uncordoned.
                seqs = {n: state.cluster.node(n).snapshot.seq for n in placement.nodes}
                reported = {n: state.reported[n] for n in placement.nodes if n in state.reported}
            racing = idempotency_key is not None and idempotency_key in state.inflight_keys
        if placement is None:
            if idempotency_key is not None:
                # A retry may find nothing free because its first try holds it: the
                # key's reservation is the answer. One still committing here is not
                # known yet either way: the client is told to retry, not that nothing fits.
                replay = yield functools.partial(_replay, state, idempotency_key, request_json)
                if isinstance(replay, Placed):  # None: the key is new
                    return replay
                if racing:
                    raise KeyInFlight(
                        "a request with this Idempotency-Key is being committed; retry it"
                        " to get its answer",
                        {"idempotency_key": idempotency_key},
                    )
            refused = refusal(outcome)
            yield from _audit_refused(state, body, request_json, refused)
            raise refused
        now = state.clock()
        tasks = tuple(views.reserved_task(t) for t in placement.tasks)
        row = {
            "id": allocation_id,
            # No confirmation write follows an active one, and active allocations never expire.
            "state": "active" if active else "pending",
            "job_id": body.job_id,
            "owner": body.owner,
            "idempotency_key": idempotency_key,
            "request": request_json,
            # Copied out of the request for the syncs' host use (state.host_use).
            "cpu_milli": body.cpu_milli,
            "memory_mib": body.memory_mib,
            "placement": views.placement_text(placement, tasks),
            "created_at": now,
            "expires_at": None if active else now + timedelta(seconds=ttl),
            "ended_at": None,
            # Live, and named by one of its own holds, or its share (schema.py): the
            # database refuses a live allocation that holds nothing.
            "live": True,
            **anchors(holds, shares),
        }
        # The decision's audit row commits with the reservation, in its transaction.
        audit = records.placed(
            now,
            str(row["id"]),
            body.job_id,
            placement.nodes,
            str(row["state"]),
            request_json,
            str(row["placement"]),
        )
        answer = views.allocation(row, tasks, placement)
        if answerable is not None:
            try:
                answerable(answer)
            except BaseException:
                _undo(state, placement, devices, shares, allocation_id, idempotency_key)
                raise
        try:
            # The committer checks the token once more just before the rows are written
            # (group_commit.py): revoked while this waited for it, Unauthorized, undone below.
            yield Commit(row, holds, placement.nodes, audit, shares, seqs, reported)
        except IntegrityError:
            _undo(state, placement, devices, shares, allocation_id, idempotency_key)
            # Another process committed first: some of these GPUs, or this very key (a
            # retry sent to another replica, which may well have chosen the same GPUs);
            # or a node's snapshot the choice was made on was replaced meanwhile, or
            # the node cordoned, or deleted and reported again.
            # The undo freed this choice in memory blindly, GPUs that process holds
            # included, and its notification may have been applied already: learn what
            # it holds before answering, whether with its allocation or a new choice.
            yield functools.partial(state.sync_nodes, list(placement.nodes))
            if idempotency_key is not None:
                replay = yield functools.partial(_replay, state, idempotency_key, request_json)
                if isinstance(replay, Placed):  # None: the key is new
                    return replay
            continue
        except OperationalError as exc:
            _undo(state, placement, devices, shares, allocation_id, idempotency_key)
            raise unavailable(exc) from None
        except BaseException:
            # Whatever else failed (a value the database refused, a fault), or the flow
            # was dropped at its commit (the request cancelled): this request's tentative
            # choice must not outlive it. Marks left in flight would keep the GPUs held
            # in memory through every sync. Had the commit landed regardless, the
            # database still holds them and the next choice of them is refused there.
            _undo(state, placement, devices, shares, allocation_id, idempotency_key)
            raise
        with state.lock:
            state.end_inflight(devices, shares, allocation_id, idempotency_key)
        return Placed(answer, True)
    raced = Unschedulable(
        f"other replicas took the chosen GPUs, or the chosen nodes reported new snapshots"
        f" or were cordoned, {PLACE_ATTEMPTS} times in a row; retry",
        {"reasons": []},
    )
    yield from _audit_refused(state, body, request_json, raced)
    raise raced


def _audit_refused(
    state: ServiceState, body: PlaceRequest, request_json: str, error: ServiceError
) -> Flow[None]:
    """The refused decision's audit row, in a transaction of its own (nothing else was
    written), unless the gate coalesces it into a later row (service/audit/refusals.py)."""
    shape = (audit_actor.current().token_id, audit_actor.current().route, _shape(body))
    coalesced = state.refusal_gate.admit(shape)
    if coalesced is None:
        return
    reasons = error.detail.get("reasons", [])
    row = records.refused(
        state.clock(), body.job_id, request_json, error.code, error.message, reasons, coalesced
    )
    yield functools.partial(_write_refused, state, row)


def _shape(body: PlaceRequest) -> str:
    """The request without what names the job: a client retrying the same impossible
    request under new job ids is one shape."""
    text = body.model_dump_json(exclude={"job_id", "owner"})
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _write_refused(state: ServiceState, row: dict[str, Any]) -> None:
    try:
        audit_store.write_alone(state.engine, row)
    except SQLAlchemyError:  # the refusal is the answer; a database hiccup must not hide it
        log.exception("the audit row of a refused placement was not written")


def _replay(state: ServiceState, key: str, request_json: str) -> Placed | None:
    """The allocation this key made before, or None. A reservation found past its TTL
    and not yet swept is expired first, through the sweep's own guarded transition
    (its holds deleted, the other replicas told, its audit row written): answered
    pending, it would tell the client it holds GPUs the next sweep gives away."""
    with state.engine.connect() as conn:
        row = repository.by_idempotency_key(conn, key)
    if row is None:
        return None
    if not same_request(row["request"], request_json):
        raise Conflict(
            "this Idempotency-Key was used for a different request; use a new key",
            {"allocation_id": row["id"]},
        )
    expires_at = row["expires_at"]
    if row["state"] not in ("pending", "degraded") or expires_at is None:
        return Placed(views.allocation(row), False)
    if views.aware(expires_at) > state.clock():
        return Placed(views.allocation(row), False)
    # The guard decides: a confirm or extend that committed since this read wins, and
    # the row is answered as it then is.
    expired = bool(ending.end(state, [str(row["id"])], "expire").ids)
    with state.engine.connect() as conn:
        row = repository.by_idempotency_key(conn, key)
    assert row is not None  # allocation rows are never deleted
    return Placed(views.allocation(row), False, expired)


def anchors(
    holds: list[tuple[str, str, str]], shares: list[tuple[str, str, int]]
) -> dict[str, str | None]:
    """The allocation row's anchor columns: its share's row for a share, else its first
    hold (a share's CPUs are held too, but the share is what it is)."""
    if shares:
        node, device, _ = shares[0]
        return {
            "anchor_node": None,
            "anchor_device": None,
            "share_node": node,
            "share_device": device,
        }
    node, device, _ = holds[0]
    return {"anchor_node": node, "anchor_device": device, "share_node": None, "share_device": None}


def _undo(
    state: ServiceState,
    placement: Placement,
    devices: list[tuple[str, str]],
    shares: list[tuple[str, str, int]],
    allocation_id: str,
    key: str | None,
) -> None:
    with state.lock:
        state.end_inflight(devices, shares, allocation_id, key)
        state.cluster.unapply(placement)
