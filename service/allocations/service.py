"""Placements and allocations: choose in memory, reserve in the database, never twice.

The write path for /place (style: snapshot in, plan out, commit optimistically):

1. under the state lock, the engine chooses and the choice is applied to the
   in-memory state at once, so concurrent requests in this process see it;
2. the allocation and one ``gpu_holds`` row per GPU are inserted in one
   transaction (shared with concurrent reservations: group_commit.py); the
   holds' primary key makes a GPU held twice impossible at the database
   level, whichever process or replica wrote first;
3. if the insert fails on a hold, another replica got there first: the
   tentative choice is undone, that replica's holds are read into memory and
   the decision is made again on fresh state (a few times, then 409).

An ``Idempotency-Key`` is stored with the allocation (unique), so a retried
request gets the same allocation back, never a second one.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar, cast

import orjson
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError, OperationalError

from placement import Cause, NodeVerdict, Outcome, Placement, TaskPlacement
from placement.explain import cause_message
from service.allocations import repository
from service.allocations.observed_gpus import observed_placement
from service.allocations.schemas import (
    PlaceRequest,
    ScoreRequest,
)
from service.allocations.stored_request import same_request
from service.db import in_transaction
from service.errors import BadRequest, Conflict, NotFound, Unavailable, Unresolvable, Unschedulable
from service.flows import drive, drive_async
from service.notify import publish
from service.state import ServiceState, cpu_device

PLACE_ATTEMPTS = 4
RELEASE_CHUNK = 64  # nodes freed per hold of the state lock when many reservations end


def task_dict(task: TaskPlacement, with_env: bool = True) -> dict[str, Any]:
    """A task as the API shows it (TaskView, or ScoreTaskView without the
    environment), built as plain data: /place and /score return many of
    these, and validating them again would cost more than the decision."""
    score = task.score
    view: dict[str, Any] = {
        "task": task.task,
        "node": task.node,
        "gpu_indices": list(task.gpu_indices),
        "gpu_uuids": list(task.gpu_uuids),
        "mig_uuids": list(task.mig_uuids),
        "cpuset": task.cpuset,
        "cpus": list(task.cpus),
        "numa_nodes": list(task.numa_nodes),
        "islands": list(task.islands),
        "nvlink_connected": task.nvlink_connected,
        "score": {
            "ring_gbps": score.ring_gbps,
            "pair_sum_gbps": score.pair_sum_gbps,
            "bandwidth": score.bandwidth,
            "fragmentation": score.fragmentation,
            "numa_nodes": score.numa_nodes,
            "free_after": score.free_after,
        },
        "reason": task.reason,
    }
    if with_env:
        visible = ",".join(task.mig_uuids or task.gpu_uuids)
        env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
        if task.cpuset:
            env["TOPOPLACE_CPUSET"] = task.cpuset
        view["env"] = env
    return view


def _holds(placement: Placement) -> list[tuple[str, str, str]]:
    """(node, device, kind) rows for gpu_holds. CPUs reserved with ``cpus_per_task``
    are held the same way (device ``cpu:N``), so they too are exclusive at the
    database level and every replica learns of them."""
    out: list[tuple[str, str, str]] = []
    for task in placement.tasks:
        if task.mig_uuids:
            out += [(task.node, m, "mig") for m in task.mig_uuids]
        else:
            out += [(task.node, g, "gpu") for g in task.gpu_uuids]
        out += [(task.node, cpu_device(c), "cpu") for c in task.cpus]
    return out


def _time(value: datetime | None) -> str | None:
    if value is None:
        return None
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return aware.isoformat().replace("+00:00", "Z")


def _view(row: Mapping[Any, Any], placed: dict[str, Any] | None = None) -> dict[str, Any]:
    """An allocation as the API shows it (AllocationView); ``placed``: its placement
    JSON already decoded, where the caller has just encoded it."""
    if placed is None:
        placed = json.loads(row["placement"])
    return {
        "id": row["id"],
        "state": row["state"],
        "job_id": row["job_id"],
        "owner": row["owner"],
        "tasks": placed["tasks"],
        "ring_gbps": placed["ring_gbps"],
        "fabric_domain": placed["fabric_domain"],
        "network_blocks": placed["network_blocks"],
        "reason": placed["reason"],
        "created_at": _time(row["created_at"]),
        "expires_at": _time(row["expires_at"]),
        "ended_at": _time(row["ended_at"]),
    }


def _refuse(outcome: Outcome) -> Exception:
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


def _ttl(state: ServiceState, requested: float | None) -> float:
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


# The /place flow is written once, as a generator that yields each step that
# waits on the database; a driver runs those steps. The thread driver
# (``place``) blocks on them: gRPC, Slurm and Kubernetes callers run in
# worker threads. The asyncio driver (``place_async``) awaits them, so the
# REST endpoint decides on the event loop (a fraction of a millisecond) and
# waits for the group commit without a thread per request: under load,
# handing every request to a worker thread and back cost more CPU than the
# decision itself.
Blocking = Callable[[], Any]
Flow = Generator["Blocking | _Commit", Any, tuple[dict[str, Any], bool]]


@dataclass(frozen=True)
class _Commit:
    row: dict[str, Any]
    holds: list[tuple[str, str, str]]
    nodes: tuple[str, ...]


def _place_flow(
    state: ServiceState, body: PlaceRequest, idempotency_key: str | None, active: bool
) -> Flow:
    request_json = body.model_dump_json()
    if idempotency_key is not None:
        replay = yield functools.partial(_replay, state, idempotency_key, request_json)
        if replay is not None:
            return replay, False
    ttl = _ttl(state, body.ttl_s)
    for _ in range(PLACE_ATTEMPTS):
        with state.lock:
            state.refresh_if_due()
            outcome = state.cluster.place(body)  # a PlacementRequest; owner and TTL stay here
            if outcome.placement is None:
                raise _refuse(outcome)
            placement = outcome.placement
            state.cluster.apply(placement)  # tentative: concurrent requests here skip these GPUs
            holds = _holds(placement)
            devices = [(node, device) for node, device, _ in holds]
            state.begin_inflight(devices)
        now = state.clock()
        placed = _placement_json(placement)
        row = {
            "id": str(uuid.uuid4()),
            # Active at once for a scheduler that owns the job from the answer on (Slurm):
            # no confirmation write follows, and active allocations never expire.
            "state": "active" if active else "pending",
            "job_id": body.job_id,
            "owner": body.owner,
            "idempotency_key": idempotency_key,
            "request": request_json,
            # json's spacing, not orjson's: repository.listing matches '"node": "<name>"'
            # in the stored text, including rows written by earlier versions.
            "placement": json.dumps(placed),
            "created_at": now,
            "expires_at": None if active else now + timedelta(seconds=ttl),
            "ended_at": None,
            # Live, and named by one of its own holds (schema.py): the database refuses
            # a live allocation that holds nothing.
            "live": True,
            "anchor_node": holds[0][0],
            "anchor_device": holds[0][1],
        }
        try:
            yield _Commit(row, holds, placement.nodes)
        except IntegrityError:
            _undo(state, placement, devices)
            if idempotency_key is not None:
                replay = yield functools.partial(_replay, state, idempotency_key, request_json)
                if replay is not None:
                    return replay, False
            # Another process holds some of these GPUs: learn what it holds, choose again.
            yield functools.partial(state.sync_nodes, list(placement.nodes))
            continue
        except OperationalError as exc:
            _undo(state, placement, devices)
            raise Unavailable(f"the database did not answer: {exc.orig}") from None
        except Exception:
            # Whatever else failed (a value the database refused, a fault), this
            # request's tentative choice must not outlive it.
            _undo(state, placement, devices)
            raise
        with state.lock:
            state.end_inflight(devices)
        return _view(row, placed), True
    raise Unschedulable(
        f"other replicas took the chosen GPUs {PLACE_ATTEMPTS} times in a row; retry",
        {"reasons": []},
    )


def place(
    state: ServiceState, body: PlaceRequest, idempotency_key: str | None
) -> tuple[dict[str, Any], bool]:
    """Choose and reserve; returns (allocation, created). A replayed key returns created=False."""

    def step(request: Blocking | _Commit) -> Any:
        if isinstance(request, _Commit):
            return state.committer.commit(request.row, request.holds, request.nodes)
        return request()

    return drive(_place_flow(state, body, idempotency_key, active=False), step)


async def place_async(
    state: ServiceState, body: PlaceRequest, idempotency_key: str | None, active: bool = False
) -> tuple[dict[str, Any], bool]:
    """``place`` for the event loop: database steps are awaited, not blocked on.
    ``active``: made active at once instead of pending until confirmed (Slurm)."""

    async def step(request: Blocking | _Commit) -> Any:
        if isinstance(request, _Commit):
            return await state.committer.commit_async(request.row, request.holds, request.nodes)
        return await asyncio.to_thread(request)

    return await drive_async(_place_flow(state, body, idempotency_key, active), step)


def _placement_json(placement: Placement) -> dict[str, Any]:
    return {
        "tasks": [task_dict(t) for t in placement.tasks],
        "ring_gbps": placement.ring_gbps,
        "fabric_domain": placement.fabric_domain,
        "network_blocks": list(placement.network_blocks),
        "reason": placement.reason,
    }


def _replay(state: ServiceState, key: str, request_json: str) -> dict[str, Any] | None:
    with state.engine.connect() as conn:
        row = repository.by_idempotency_key(conn, key)
    if row is None:
        return None
    if not same_request(row["request"], request_json):
        raise Conflict(
            "this Idempotency-Key was used for a different request; use a new key",
            {"allocation_id": row["id"]},
        )
    return _view(row)


def _undo(state: ServiceState, placement: Placement, devices: list[tuple[str, str]]) -> None:
    with state.lock:
        state.end_inflight(devices)
        state.cluster.unapply(placement)


def get(state: ServiceState, allocation_id: str) -> dict[str, Any]:
    with state.engine.connect() as conn:
        row = repository.by_id(conn, allocation_id)
    if row is None:
        raise NotFound(f"no allocation {allocation_id!r}")
    return _view(row)


def listing(
    state: ServiceState, job_id: str | None, node: str | None, status: str | None, limit: int
) -> list[dict[str, Any]]:
    with state.engine.connect() as conn:
        rows = repository.listing(conn, job_id=job_id, node=node, state=status, limit=limit)
    return [_view(r) for r in rows]


@dataclass(frozen=True)
class _Outcome:
    """What a lifecycle transaction did: the row as it left it, the holds it freed, and
    the refusal to raise once the transaction has committed (an expiry it found due is
    kept, not rolled back with the refusal)."""

    row: Mapping[Any, Any] | None
    freed: list[repository.FreedHold]
    refusal: Exception | None = None


def _lifecycle(state: ServiceState, work: Callable[[Connection], _Outcome]) -> dict[str, Any]:
    outcome = in_transaction(state.engine, work)
    _forget(state, outcome.freed)
    if outcome.refusal is not None:
        raise outcome.refusal
    assert outcome.row is not None
    return _view(outcome.row)


def _refused_transition(conn: Connection, allocation_id: str, now: datetime, verb: str) -> _Outcome:
    """Why the guard of ``verb`` did not hold; a reservation found past its TTL is
    expired here and then, so the answer and the database say the same."""
    row = repository.by_id(conn, allocation_id)
    if row is None:
        return _Outcome(None, [], NotFound(f"no allocation {allocation_id!r}"))
    freed: list[repository.FreedHold] = []
    if row["state"] in ("pending", "degraded") and row["expires_at"] is not None:
        # The guard failed on a live reservation with a TTL: the TTL has passed.
        _, freed = repository.end(conn, [allocation_id], "expire", now)
        publish(conn, {h.node for h in freed})
        row = repository.by_id(conn, allocation_id)
        assert row is not None
        message = (
            f"allocation {allocation_id} expired at {_time(row['ended_at'])}: its TTL passed"
            f" before the {verb}; place the job again"
        )
    elif verb == "extend" and row["state"] in ("active", "degraded"):
        message = f"allocation {allocation_id} is {row['state']}; only a pending one has a TTL"
    else:
        message = (
            f"allocation {allocation_id} is {row['state']}; only a pending one can be {verb}ed"
        )
    return _Outcome(row, freed, Conflict(message, {"state": row["state"]}))


def confirm(state: ServiceState, allocation_id: str) -> dict[str, Any]:
    """pending -> active (degraded stays degraded, without a TTL); confirming again is a
    no-op; a reservation whose TTL passed is expired and refused."""
    now = state.clock()

    def work(conn: Connection) -> _Outcome:
        row = repository.confirm(conn, allocation_id, now)
        if row is not None:
            return _Outcome(row, [])
        current = repository.by_id(conn, allocation_id)
        # Confirmed before (active, or degraded without a TTL): the same answer again.
        already = current is not None and current["state"] in ("active", "degraded")
        if already and current is not None and current["expires_at"] is None:
            return _Outcome(current, [])
        return _refused_transition(conn, allocation_id, now, "confirm")

    return _lifecycle(state, work)


def extend(state: ServiceState, allocation_id: str, ttl_s: float) -> dict[str, Any]:
    ttl = _ttl(state, ttl_s)
    now = state.clock()

    def work(conn: Connection) -> _Outcome:
        row = repository.extend(conn, allocation_id, now, now + timedelta(seconds=ttl))
        if row is not None:
            return _Outcome(row, [])
        return _refused_transition(conn, allocation_id, now, "extend")

    return _lifecycle(state, work)


def _end(state: ServiceState, ids: list[str] | None, transition: str) -> list[str]:
    """End what the transition's guard lets through; memory follows the database."""
    now = state.clock()

    def work(conn: Connection) -> tuple[list[str], list[repository.FreedHold]]:
        ended, freed = repository.end(conn, ids, transition, now)
        publish(conn, {h.node for h in freed})
        return ended, freed

    ended, freed = in_transaction(state.engine, work)
    _forget(state, freed)
    return ended


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


def release(state: ServiceState, allocation_id: str) -> list[str]:
    """End one live allocation; releasing an ended one is a no-op, an unknown id a 404."""
    ended = _end(state, [allocation_id], "release")
    if not ended:
        get(state, allocation_id)  # 404 for an unknown id
    return ended


ObservedAction = Literal["matched", "attached", "moved", "created"]


@dataclass(frozen=True)
class Observation:
    """What ``observe`` did to make the database say what the scheduler runs.

    ``action``: ``matched`` (it said so already), ``attached`` (and now carries the
    job id), ``moved`` (an allocation of the job took the GPUs the job runs on) or
    ``created`` (the job had none). ``superseded``: other allocations that held
    those GPUs, released; ``merged``: the job's further allocations, ended because
    one now holds all its GPUs."""

    action: ObservedAction
    allocation_id: str
    superseded: list[str]
    merged: list[str]


OBSERVE_ATTEMPTS = 3


def attach(state: ServiceState, allocation_ids: list[str], job_id: str) -> list[str]:
    """The scheduler's job id on live allocations that have none; the ids changed."""
    if not allocation_ids:
        return []
    now = state.clock()
    return in_transaction(
        state.engine, lambda conn: repository.attach(conn, allocation_ids, job_id, now)
    )


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
    placed = observed_placement(snapshots, gpus, reason)
    placement_text = json.dumps(placed)

    def work(conn: Connection) -> tuple[Observation, list[repository.FreedHold]]:
        now = state.clock()
        rows = repository.live_for_job(conn, job_id, named)
        ids = [str(r["id"]) for r in rows]
        if ids and repository.holds_of(conn, ids) == wanted:
            attached = repository.attach(conn, ids, job_id, now)
            return Observation("attached" if attached else "matched", ids[0], [], []), []
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
        if moved is not None:
            observation = Observation("moved", ids[0], superseded, merged)
        else:
            row = _observed_row(job_id, owner, gpus, placement_text, holds, now)
            repository.insert(conn, row, holds)
            observation = Observation("created", str(row["id"]), superseded, merged)
        publish(conn, {h.node for h in freed} | set(gpus))
        return observation, freed

    for attempt in range(OBSERVE_ATTEMPTS):
        try:
            observation, freed = in_transaction(state.engine, work)
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


def release_job(state: ServiceState, job_id: str) -> list[str]:
    with state.engine.connect() as conn:
        ids = repository.live_ids_for_job(conn, job_id)
    return _end(state, ids, "release")


def sweep(state: ServiceState) -> list[str]:
    """Expire reservations whose TTL passed and that nobody confirmed; returns their ids."""
    return _end(state, None, "expire")


# id(task) -> (task, what was made of it). The engine hands back the same
# TaskPlacement for a node while the node is unchanged (decide.verdict_rows),
# so repeated /score calls reuse what was made of it too; holding the task
# keeps its id unique.
_TASK_VIEWS: dict[int, tuple[TaskPlacement, Any]] = {}
_VIEWS_MAX = 200_000


def _remembered(
    cache: dict[int, tuple[TaskPlacement, Any]], task: TaskPlacement, make: Callable[[], Any]
) -> Any:
    hit = cache.get(id(task))
    if hit is not None and hit[0] is task:
        return hit[1]
    if len(cache) >= _VIEWS_MAX:
        cache.clear()
    view = make()
    cache[id(task)] = (task, view)
    return view


def task_view(task: TaskPlacement) -> dict[str, Any]:
    """A /score task as plain data (ScoreTaskView), remembered per task."""
    return cast(dict[str, Any], _remembered(_TASK_VIEWS, task, lambda: task_dict(task, False)))


def _fit_row(
    node: str, rank: int, score: float, task: TaskPlacement, view: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "node": node,
        "fits": True,
        "rank": rank,
        "score": score,
        "cause": None,
        "message": task.reason,
        "resolvable": True,
        "task": task_view(task) if view is None else view,
    }


def _refused_row(node: str, cause: Cause, message: str) -> dict[str, Any]:
    return {
        "node": node,
        "fits": False,
        "rank": None,
        "score": 0.0,
        "cause": cause.value,
        "message": message,
        "resolvable": cause.resolvable,
        "task": None,
    }


_RANK_MARK = 987_654_321  # stands for the rank while a fitting row is encoded once
# id(task) -> (task, score, the row's JSON before the rank, after it): see score_json.
_ROW_PARTS: dict[int, tuple[TaskPlacement, float, bytes, bytes]] = {}


def _row_parts(task: TaskPlacement, score: float) -> tuple[TaskPlacement, float, bytes, bytes]:
    """A fitting node's NodeScoreView encoded around its rank, the only part that moves
    while the node is unchanged."""
    encoded = orjson.dumps(_fit_row(task.node, _RANK_MARK, score, task, task_dict(task, False)))
    # Split where the key is: a quote inside a JSON string is escaped, so this text
    # cannot come from the node's name, the only field before it.
    mark = b'"rank":%d' % _RANK_MARK
    before, after = encoded.split(mark, 1)
    before += b'"rank":'
    if len(_ROW_PARTS) >= _VIEWS_MAX:
        _ROW_PARTS.clear()
    parts = _ROW_PARTS[id(task)] = (task, score, before, after)
    return parts


class _Messages:
    """One message per cause: hundreds of refused nodes share a handful of causes."""

    def __init__(self, body: ScoreRequest) -> None:
        self.body = body
        self._of: dict[Cause, str] = {}

    def of(self, cause: Cause) -> str:
        message = self._of.get(cause)
        if message is None:
            message = self._of[cause] = cause_message(cause, self.body)
        return message


def score(state: ServiceState, body: ScoreRequest) -> list[dict[str, Any]]:
    """Every requested node's verdict as the API shows it (NodeScoreView), as plain data."""
    messages = _Messages(body)
    return _score_rows(
        state,
        body,
        _fit_row,
        lambda node, cause: _refused_row(node, cause, messages.of(cause)),
        lambda v: _refused_row(v.node, v.cause or Cause.NOT_REGISTERED, v.message),
    )


def score_json(state: ServiceState, body: ScoreRequest) -> bytes:
    """The same answer as a ScoreResult, encoded. Each fitting node's row is encoded once
    while the node is unchanged and only its rank is written per call, so scoring 500
    nodes pod after pod costs a join instead of 500 nested objects built and encoded."""
    messages = _Messages(body)
    refused_tails: dict[Cause, bytes] = {}
    remembered = _ROW_PARTS.get

    def fit(node: str, rank: int, score: float, task: TaskPlacement) -> bytes:
        # Inline on purpose: this runs once per fitting node per call.
        parts = remembered(id(task))
        if parts is None or parts[0] is not task or parts[1] != score:
            parts = _row_parts(task, score)
        return b"%s%d%s" % (parts[2], rank, parts[3])

    def refused(node: str, cause: Cause) -> bytes:
        tail = refused_tails.get(cause)
        if tail is None:
            row = orjson.dumps(_refused_row("", cause, messages.of(cause)))
            tail = refused_tails[cause] = row[len(b'{"node":""') :]
        return b'{"node":' + orjson.dumps(node) + tail

    rows = _score_rows(
        state,
        body,
        fit,
        refused,
        lambda v: orjson.dumps(_refused_row(v.node, v.cause or Cause.NOT_REGISTERED, v.message)),
    )
    return b'{"nodes":[' + b",".join(rows) + b"]}"


Row = TypeVar("Row")


def _score_rows(
    state: ServiceState,
    body: ScoreRequest,
    fit: Callable[[str, int, float, TaskPlacement], Row],
    refused: Callable[[str, Cause], Row],
    refused_mig: Callable[[NodeVerdict], Row],
) -> list[Row]:
    with state.lock:
        state.refresh_if_due()
        if body.mig_profile is None:
            return state.cluster.verdict_rows(body, fit, refused)
        verdicts = state.cluster.evaluate(body)
    return [
        fit(v.node, v.rank or 0, v.score, v.task)
        if v.fits and v.task is not None
        else refused_mig(v)
        for v in verdicts
    ]
