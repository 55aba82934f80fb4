"""The allocations API: the one entry point for every change to an allocation and every read.

REST (endpoints.py), gRPC (service/grpc/servicer.py), the Kubernetes
extender (bind, gangs, preemption, its reconciler), the Slurm filter, prolog
and reconciler, and the background sweep all call these functions and
nothing below them. What they get back is typed and frozen (results.py);
JSON is written only at the edges (encoding.py for REST, service/grpc/convert.py
for gRPC and the Watch stream).

The event rule: every change publishes exactly one event on the state's
hub (service/events.py), here and only here, whoever asked for it; a call
that changes nothing publishes nothing (a replayed Idempotency-Key, a
confirm repeated, a release of an ended allocation, an observation that
matched). docs/grpc.md lists the event types. Each change also leaves one
audit row of the same name (service/audit/), written below, in the change's
own transaction (place_flow.py's commit, lifecycle.py), so the audit log and
the events tell the same story (tests/service/allocations/test_events_per_change.py).

| change | event |
|---|---|
| a reservation made (/place, a bind, a gang, the Slurm filter) | ``placed`` |
| an allocation created from what the scheduler runs (Slurm) | ``placed`` |
| pending -> active, or a degraded one's TTL dropped | ``confirmed`` |
| a new TTL | ``extended`` |
| ended by a release (a caller, a reconciler; superseded or merged by Slurm) | ``released`` |
| ended by its TTL (the sweep, or a confirm or extend that found it passed) | ``expired`` |
| a live allocation learnt its scheduler job id | ``attached`` |
| a live allocation (or one task) moved onto the GPUs or MIG instances it runs on | ``moved`` |

A live reservation stamped as reused (``touch``: a retried bind, a gang member's claim)
changes nothing an allocation's view shows: no event, no audit row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Literal

from sqlalchemy.engine import Connection

from service.allocations import lifecycle, place_flow, queries, score_pages, scoring
from service.allocations.place_flow import Flow, Step, run, run_async
from service.allocations.results import (
    Allocation,
    Ended,
    NotObserved,
    Observation,
    Placed,
    ScorePage,
)
from service.allocations.schemas import PlaceRequest, ScoreRequest
from service.errors import Unresolvable, Unschedulable
from service.state import ServiceState

__all__ = [
    "Flow",
    "NodeChanged",
    "ObservedJob",
    "ObservedTask",
    "Step",
    "attach",
    "await_step",
    "by_ids",
    "confirm",
    "count_for_job",
    "extend",
    "get",
    "gpus_truth",
    "listing",
    "live",
    "live_keyed_under",
    "mig_truth",
    "observe",
    "observe_all",
    "place",
    "place_async",
    "placing",
    "release",
    "release_job",
    "run",
    "run_async",
    "run_step",
    "score",
    "score_json",
    "score_page",
    "sweep",
    "task_truth",
    "touch",
    "used_since",
]

EventType = Literal["placed", "confirmed", "extended", "released", "expired", "attached", "moved"]


def _publish(state: ServiceState, type_: EventType, allocation: Allocation) -> None:
    state.events.publish("allocation", type_, allocation=allocation)


def _publish_ids(state: ServiceState, type_: EventType, ids: Sequence[str]) -> None:
    """One event per id, carrying the allocation as it is now; read only when watched."""
    if ids and state.events.watched:
        for allocation in queries.by_ids(state, ids):
            _publish(state, type_, allocation)
    else:  # nobody watches: the events are tallied (/metrics), not read and built
        ended = ids if type_ in ("released", "expired") else ()
        state.events.unwatched("allocation", type_, len(ids), ended=ended)


# ---- reads ----------------------------------------------------------------------

get = queries.get
listing = queries.listing
count_for_job = queries.count_for_job
by_ids = queries.by_ids
live = queries.live
live_keyed_under = queries.live_keyed_under
used_since = queries.used_since
# A job's (or a gang task's) truth taken from what its scheduler runs, for ``observe_all``.
ObservedJob = lifecycle.ObservedJob
NodeChanged = lifecycle.NodeChanged  # a truth named on a replaced snapshot: name it again
ObservedTask = lifecycle.ObservedTask
gpus_truth = lifecycle.gpus_truth
mig_truth = lifecycle.mig_truth
task_truth = lifecycle.task_truth
score = scoring.score
score_json = scoring.score_json


def score_page(
    state: ServiceState, body: ScoreRequest, limit: int | None, offset: int
) -> ScorePage:
    """/score bounded by TOPOPLACE_MAX_SCORE_NODES (score_pages.py): the whole answer
    when it is within the bound and not paged, else the page asked for; an answer over
    the bound, unpaged, is refused (InvalidRequest on ``limit``)."""
    maximum = state.settings.max_score_nodes
    count = score_pages.listed_count(body.nodes, len(state.cluster))
    paged = score_pages.check_bound(count, limit, offset, maximum)
    rows = scoring.score(state, body)
    if not paged:
        return ScorePage(tuple(rows), len(rows), 0, None)
    return score_pages.page(rows, limit, offset, maximum)


# ---- placing ---------------------------------------------------------------------


def placing(
    state: ServiceState,
    body: PlaceRequest,
    idempotency_key: str | None,
    active: bool = False,
    replay_first: bool = True,
    answerable: place_flow.AnswerCheck | None = None,
) -> Flow[Placed]:
    """The /place flow with its event, for a caller that drives a flow of its own (the
    Slurm filter takes its reservations with ``yield from``) and for the two drivers
    below. ``active``: made active at once instead of pending until confirmed.
    ``replay_first=False``: the key is expected to be new; an earlier use is found at
    the commit instead of by a read before it (place_flow.py)."""
    try:
        placed = yield from place_flow.place_flow(
            state, body, idempotency_key, active, replay_first, answerable
        )
    except (Unschedulable, Unresolvable) as refused:
        causes = [str(r["cause"]) for r in refused.detail.get("reasons", ())]
        state.metrics.refused(refused.code, causes)
        raise
    if placed.created:
        _publish(state, "placed", placed.allocation)
    elif placed.expired:
        _publish(state, "expired", placed.allocation)
    return placed


def place(
    state: ServiceState,
    body: PlaceRequest,
    idempotency_key: str | None,
    active: bool = False,
    replay_first: bool = True,
    at_once: bool = False,
    answerable: place_flow.AnswerCheck | None = None,
) -> Placed:
    """Choose and reserve, blocking on the database (worker threads: gRPC, Kubernetes).
    ``at_once``: the reservation written on this thread where SQLite allows it
    (group_commit.py), for callers that wait on one reservation alone."""
    flow = placing(state, body, idempotency_key, active, replay_first, answerable)
    return run(state, flow, at_once)


async def place_async(
    state: ServiceState, body: PlaceRequest, idempotency_key: str | None, active: bool = False
) -> Placed:
    """``place`` on the event loop: the database steps are awaited, not blocked on."""
    return await run_async(state, placing(state, body, idempotency_key, active))


def run_step(state: ServiceState, step: Step, at_once: bool = False) -> object:
    """One step of ``placing``, blocking on it: for a caller whose own flow yields these
    steps among others of its own (the Kubernetes bind) and so drives it itself."""
    return place_flow.blocking_step(state, at_once, step)


async def await_step(state: ServiceState, step: Step, at_once: bool = False) -> object:
    """``run_step`` on the event loop, awaiting the step."""
    return await place_flow.awaited_step(state, at_once, step)


# ---- the lifecycle ----------------------------------------------------------------


def _settle(state: ServiceState, transition: lifecycle.Transition, type_: EventType) -> Allocation:
    if transition.allocation is not None:
        if transition.expired:
            _publish(state, "expired", transition.allocation)
        elif transition.changed:
            _publish(state, type_, transition.allocation)
    if transition.refusal is not None:
        raise transition.refusal
    assert transition.allocation is not None
    return transition.allocation


def confirm(state: ServiceState, allocation_id: str) -> Allocation:
    return _settle(state, lifecycle.confirm(state, allocation_id), "confirmed")


def extend(state: ServiceState, allocation_id: str, ttl_s: float) -> Allocation:
    return _settle(state, lifecycle.extend(state, allocation_id, ttl_s), "extended")


def release(
    state: ServiceState,
    allocation_id: str,
    quiet: datetime | None = None,
    ended_job: str | None = None,
) -> Ended:
    """End one live allocation. ``quiet``: only if it was neither made nor reused
    (``touch``) after that moment (a reconciler's cutoff), checked in the release's
    own statement. ``ended_job``: because that job ended (the Slurm reconcile loop saw
    it end), which is remembered with it: a report of the job's start processed after
    this records nothing (``observe``'s ``started``)."""
    ended = lifecycle.release(state, allocation_id, quiet=quiet, ended_job=ended_job)
    _publish_ids(state, "released", ended.ids)
    return ended


def release_job(
    state: ServiceState, job_id: str, quiet: datetime | None = None, ended: bool = False
) -> Ended:
    """End every live allocation carrying ``job_id`` (``quiet`` as for ``release``).
    ``ended``: the job ended (a caller releasing a job through the API: a Slurm epilog),
    remembered as for ``release``."""
    released = lifecycle.release_job(state, job_id, quiet=quiet, ended=ended)
    _publish_ids(state, "released", released.ids)
    return released


def touch(state: ServiceState, allocation_id: str) -> Allocation | None:
    """A live reservation reused (a retried bind, a gang member's claim), stamped so before
    the caller's Binding: a release guarded by an earlier ``quiet`` leaves it. None when
    it is no longer live. No event: nothing an allocation's view shows changes."""
    return lifecycle.touch(state, allocation_id)


def sweep(state: ServiceState) -> Ended:
    """Expire the reservations whose TTL passed (the background loop, every 0.1 s)."""
    ended = lifecycle.sweep(state)
    _publish_ids(state, "expired", ended.ids)
    return ended


# ---- a scheduler's truth (Slurm) ----------------------------------------------------


def attach(state: ServiceState, allocation_ids: list[str], job_id: str) -> tuple[str, ...]:
    """The scheduler's job id on live allocations that have none; the ids changed."""
    attached = lifecycle.attach(state, allocation_ids, job_id)
    _publish_ids(state, "attached", attached)
    return attached


def observe(
    state: ServiceState,
    job_id: str,
    owner: str,
    gpus: dict[str, list[int]],
    named: list[str],
    reason: str,
    started: bool = False,
    touch: bool = False,
    run: int | None = None,
) -> Observation:
    """The scheduler runs ``job_id`` on ``gpus`` (node -> indices): make it so here
    (lifecycle.gpus_truth, taken alone by ``observe_all``). Events: the allocations it
    released first, then the one that now holds the job (attached, moved, or placed
    when created). ``started``: read as the job started (a Slurm prolog), so perhaps
    processed after the job ended: then nothing is written (action ``ended``,
    lifecycle.ObservedJob). ``touch``: a report that the job has just started (any run),
    which stamps the job's allocations as used where it matches them (ObservedJob).
    ``run``: which run of the job it is (a requeued job's restart count): a report of an
    earlier run than one recorded is ``ended`` too.
    Indices are named again on the node's snapshot when the one they were mapped on was
    replaced meanwhile (lifecycle.NodeChanged)."""
    for attempt in range(lifecycle.OBSERVE_ATTEMPTS):
        truth = gpus_truth(state, job_id, owner, gpus, named, reason, started, touch=touch, run=run)
        try:
            (observation,) = observe_all(state, [truth])
        except NodeChanged:
            if attempt == lifecycle.OBSERVE_ATTEMPTS - 1:
                raise
            continue
        assert isinstance(observation, Observation)  # only a task's truth is ever not taken
        return observation
    raise AssertionError("the last attempt returns or raises")


def observe_all(
    state: ServiceState,
    truths: Sequence[ObservedJob | ObservedTask],
    first: Callable[[Connection], None] | None = None,
) -> list[Observation | NotObserved]:
    """Several truths taken in one transaction (lifecycle.observe_all): jobs'
    (``gpus_truth``, ``mig_truth``) and gang tasks' (``task_truth``: one task of an
    allocation moved, event ``moved``), with the events of ``observe`` for each; a task
    that cannot be moved is answered ``NotObserved`` and changes nothing. ``first``: the
    caller's check and write, first in that transaction (a device report's order)."""
    answers = lifecycle.observe_all(state, truths, first)
    for answer in answers:
        if isinstance(answer, Observation):
            _publish_observation(state, answer)
    return answers


def _publish_observation(state: ServiceState, observation: Observation) -> None:
    _publish_ids(state, "released", [*observation.superseded, *observation.merged])
    held: dict[str, tuple[EventType, Sequence[str]]] = {
        "attached": ("attached", observation.attached),
        "moved": ("moved", [observation.allocation_id]),
        "created": ("placed", [observation.allocation_id]),
    }
    if observation.action in held:
        type_, ids = held[observation.action]
        _publish_ids(state, type_, ids)
