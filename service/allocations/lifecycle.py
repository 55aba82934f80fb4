"""The allocation lifecycle after /place: confirm, extend, release, expire, and a
scheduler's truth (attach, observe). docs/service.md draws the state machine.

Each change is one transaction whose guards live in repository.py; memory
follows the database afterwards (``ending.forget``). These functions say what they
changed and publish nothing: the allocations API (api.py) turns each change
into exactly one event, whoever asked for it, and each such change writes
its one audit row (service/audit/) in its own transaction, so the database
never holds a change without its row or a row without its change.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeGuard

from sqlalchemy.engine import Connection, RowMapping
from sqlalchemy.exc import DBAPIError, IntegrityError

from placement.snapshot import NodeSnapshot
from service.allocations import ended_jobs, queries, repository, stale_holders, views
from service.allocations.encoding import time_text
from service.allocations.ending import end as _end
from service.allocations.ending import ending as _ending
from service.allocations.ending import forget as _forget
from service.allocations.mapped_on import MappedOn
from service.allocations.observed_gpus import observed_mig_placement, observed_placement
from service.allocations.place_flow import checked_ttl
from service.allocations.results import Allocation, Ended, NotObserved, Observation
from service.allocations.schemas import PlaceRequest
from service.allocations.stored_request import host_figures
from service.audit import records
from service.audit import store as audit
from service.db import in_transaction
from service.edge import revoked_meanwhile
from service.errors import BadRequest, Conflict, NotFound, ServiceError
from service.lost_commit import following
from service.notify import publish
from service.state import ServiceState

OBSERVE_ATTEMPTS = 3
GUARD_ATTEMPTS = 3  # a confirm or extend run again on a row another replica just changed


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


def _transition(
    state: ServiceState,
    work: Callable[[Connection], _Outcome],
    landed: Callable[[Connection], _Outcome | None] | None = None,
) -> Transition:
    """``work`` in a transaction, memory following. ``landed``: after a connection lost at
    the commit, what the transaction did if it committed after all (None: it did not)."""
    # A caller's token revoked while it waited (its body, the lock) writes nothing.
    revoked_meanwhile.refuse_if_revoked()
    try:
        with following(state):  # a commit answer lost: memory reads what the database says
            outcome = in_transaction(state.engine, work, state.metrics.retried)
    except DBAPIError as exc:
        found = _looked_up(state, landed) if exc.connection_invalidated else None
        if found is None:
            raise
        # Committed, its answer lost with the connection: answered (and told to watchers)
        # as made, not 503 while the retry finds it made and says nothing.
        outcome = found
    _forget(state, outcome.freed)
    allocation = None if outcome.row is None else views.allocation(outcome.row)
    return Transition(allocation, outcome.changed, outcome.expired, outcome.refusal)


def _looked_up(
    state: ServiceState, landed: Callable[[Connection], _Outcome | None] | None
) -> _Outcome | None:
    """``landed`` on a new connection; None when there is none or the database cannot say."""
    if landed is None:
        return None
    try:
        with state.engine.connect() as conn:
            return landed(conn)
    except DBAPIError:
        return None


def _made(
    allocation_id: str, action: str, now: datetime, verb: str
) -> Callable[[Connection], _Outcome | None]:
    """Whether the transition ``action`` of ``now`` committed (its audit row, written in
    its transaction, is stored), and then the row as it is; or whether the transaction
    expired the reservation instead, its TTL found passed (``_refused``): then answered
    so, as the committed transaction would have been, with its ``expired`` event."""

    def landed(conn: Connection) -> _Outcome | None:
        if audit.written(conn, allocation_id, action, now):
            return _Outcome(repository.by_id(conn, allocation_id), True, [])
        if not audit.written(conn, allocation_id, "expired", now):
            return None
        row = repository.by_id(conn, allocation_id)
        assert row is not None  # allocation rows are never deleted
        refusal = Conflict(_expired_message(allocation_id, row, verb), {"state": row["state"]})
        return _Outcome(row, False, [], expired=True, refusal=refusal)

    return landed


def _expired_message(allocation_id: str, row: Mapping[Any, Any], verb: str) -> str:
    return (
        f"allocation {allocation_id} expired at {time_text(views.aware(row['ended_at']))}:"
        " its TTL passed"
        f" before the {verb}; place the job again"
    )


def _guarded(allocation_id: str, verb: str, attempt: Callable[[], _Outcome | None]) -> _Outcome:
    """``attempt`` (the guarded statement, and why it did not hold) until it has an
    answer: None means the row changed between the two, and the guard runs again."""
    for _ in range(GUARD_ATTEMPTS):
        outcome = attempt()
        if outcome is not None:
            return outcome
    raise Conflict(f"allocation {allocation_id} kept changing during the {verb}; retry")


def _refused(conn: Connection, allocation_id: str, now: datetime, verb: str) -> _Outcome | None:
    """Why the guard of ``verb`` did not hold; a reservation found past its TTL is
    expired here and then, so the answer and the database say the same. None: the row
    is not past its TTL after all. On Postgres each statement sees what committed
    before it, and another replica whose moment came earlier (an extend, a confirm) may
    have committed between the guard and this read: the caller runs its guard again."""
    row = repository.by_id(conn, allocation_id)
    if row is None:
        return _Outcome(None, False, [], refusal=NotFound(f"no allocation {allocation_id!r}"))
    freed: list[repository.FreedHold] = []
    expired = False
    if row["state"] in ("pending", "degraded") and row["expires_at"] is not None:
        # The guard failed on a live reservation with a TTL: the TTL has passed, unless
        # the row changed since, which the expiry's own guard tells.
        ended, freed = repository.end(conn, [allocation_id], "expire", now)
        if not ended:
            return None
        publish(conn, {h.node for h in freed})
        row = repository.by_id(conn, allocation_id)
        assert row is not None
        audit.write(conn, [records.allocation_change("expired", now, row)])
        expired = True
        message = _expired_message(allocation_id, row, verb)
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

    def attempt(conn: Connection) -> _Outcome | None:
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

    return _transition(
        state,
        lambda conn: _guarded(allocation_id, "confirm", lambda: attempt(conn)),
        _made(allocation_id, "confirmed", now, "confirm"),
    )


def extend(state: ServiceState, allocation_id: str, ttl_s: float) -> Transition:
    ttl = checked_ttl(state, ttl_s)
    now = state.clock()

    def attempt(conn: Connection) -> _Outcome | None:
        row = repository.extend(conn, allocation_id, now, now + timedelta(seconds=ttl))
        if row is not None:
            audit.write(conn, [records.allocation_change("extended", now, row)])
            return _Outcome(row, True, [])
        return _refused(conn, allocation_id, now, "extend")

    return _transition(
        state,
        lambda conn: _guarded(allocation_id, "extend", lambda: attempt(conn)),
        _made(allocation_id, "extended", now, "extend"),
    )


def _job_ended(
    state: ServiceState,
    job_id: str,
    now: datetime,
    work: Callable[[Connection], list[str] | None],
    quiet: datetime | None = None,
    named: Sequence[str] | None = None,
) -> Ended:
    """End the allocations ``work`` names (None: none; with ``quiet``, only those ``_end``
    would) in a transaction that first holds the job (ended_jobs.lock) and remembers that
    it ended: a report of its start processed after this records nothing
    (``observe_all``, ``ObservedJob.started``). Where ``quiet`` kept every allocation
    named live (a report of the job's start used them since), the end is not
    remembered: the view that said it is older than that report. ``named``: the
    allocations ``work`` names, where it names them by id (None: the job's own)."""
    forget_before = now - timedelta(seconds=state.settings.ended_job_memory_s)

    def ending(conn: Connection) -> tuple[list[str], list[repository.FreedHold]]:
        ended_jobs.lock(conn, [job_id], forget_before)
        ids = work(conn)
        ended, freed = _ending(conn, ids, "release", now, quiet) if ids else ([], [])
        if ended or quiet is None or not any(r["live"] for r in repository.by_ids(conn, ids or [])):
            ended_jobs.remember(conn, [job_id], now)
        return ended, freed

    revoked_meanwhile.refuse_if_revoked()
    try:
        with following(state):  # a commit answer lost: memory reads what the database says
            ended, freed = in_transaction(state.engine, ending, state.metrics.retried)
    except DBAPIError as exc:
        landed = _job_landed(state, job_id, now, named) if exc.connection_invalidated else None
        if landed is None:
            raise
        # Committed, its answer lost with the connection: answered (and told to watchers)
        # as made, not 503 while the epilog's retry finds nothing left and says nothing.
        return Ended(tuple(landed))
    _forget(state, freed)
    return Ended(tuple(ended))


def _job_landed(
    state: ServiceState, job_id: str, now: datetime, named: Sequence[str] | None
) -> list[str] | None:
    """After a connection lost at the commit of ``_job_ended``: what it released if it
    committed (its end of the job remembered at ``now``, in its transaction), the
    allocations ``named`` or, without, the job's; None when it did not or the database
    cannot say (the error stands). Memory was read already."""
    try:
        with state.engine.connect() as conn:
            if not ended_jobs.said_at(conn, job_id, now):
                return None
            ids = repository.ended_by(conn, named, "release", now)
            if named is not None:
                return ids
            return sorted(
                str(r["id"]) for r in repository.by_ids(conn, ids) if r["job_id"] == job_id
            )
    except DBAPIError:
        return None


def release(
    state: ServiceState,
    allocation_id: str,
    quiet: datetime | None = None,
    ended_job: str | None = None,
) -> Ended:
    """End one live allocation; releasing an ended one is a no-op, an unknown id a 404.
    ``quiet``: end it only if it was neither made nor reused (``touch``) after that
    moment, as one statement (a reconciler's decision, taken from a view of that age).
    ``ended_job``: the allocation ends because that job ended, which is remembered in the
    same transaction (``_job_ended``)."""
    if ended_job is None:
        ended = _end(state, [allocation_id], "release", quiet)
    else:
        named = [allocation_id]
        ended = _job_ended(state, ended_job, state.clock(), lambda _: named, quiet, named)
    if not ended.ids:
        queries.get(state, allocation_id)  # 404 for an unknown id
    return ended


def release_job(
    state: ServiceState, job_id: str, quiet: datetime | None = None, ended: bool = False
) -> Ended:
    """End the job's live allocations (``quiet`` as for ``release``). ``ended``: the job
    itself ended (a scheduler's epilog says so), which is remembered with the release
    (``_job_ended``)."""
    if ended:
        return _job_ended(
            state,
            job_id,
            state.clock(),
            lambda conn: repository.live_ids_for_job(conn, job_id),
            quiet,
        )
    with state.engine.connect() as conn:
        ids = repository.live_ids_for_job(conn, job_id)
    return _end(state, ids, "release", quiet)


def touch(state: ServiceState, allocation_id: str) -> Allocation | None:
    """Stamp a live reservation as reused now, before the caller acts on it (a retried
    bind writes its Binding next): a release guarded by an older ``quiet`` moment then
    leaves it. The allocation as it is, or None when it is no longer live (the caller
    reserves anew). Changes nothing the allocation's view shows. A write as any other: the
    stamp keeps the reservation from the reconciler, so a caller's token revoked while it
    waited (a bind's read of its pod, a gang's lock) stamps nothing."""
    revoked_meanwhile.refuse_if_revoked()
    now = state.clock()
    row = in_transaction(
        state.engine, lambda conn: repository.touch(conn, allocation_id, now), state.metrics.retried
    )
    return None if row is None else views.allocation(row)


def sweep(state: ServiceState) -> Ended:
    """Expire reservations whose TTL passed and that nobody confirmed.

    A read first: usually nothing is due, and the write would otherwise hold SQLite's
    write lock every round, sending the at-once writes of binds and Slurm submissions
    that meet it to the group committer's queue. A row that falls due between the read
    and the next round waits for that round (0.1 s).
    """
    with state.engine.connect() as conn:
        if not repository.any_due(conn, "expire", state.clock()):
            return Ended(())
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

    revoked_meanwhile.refuse_if_revoked()
    try:
        return tuple(in_transaction(state.engine, work, state.metrics.retried))
    except DBAPIError as exc:
        landed = _attached(state, allocation_ids, now) if exc.connection_invalidated else None
        if landed is None:
            raise
        # Committed, its answer lost with the connection: answered (and told to watchers)
        # as made, not an error while the next try finds the job id there and says nothing.
        return landed


def _attached(
    state: ServiceState, allocation_ids: list[str], now: datetime
) -> tuple[str, ...] | None:
    """After a connection lost at the commit of ``attach``: the ids it gave the job id if
    it committed (their audit rows, written in its transaction at its own moment); None
    when it attached none or the database cannot say (the error stands). An attach that
    changed nothing committed nothing to look up: its next try answers the same."""
    try:
        with state.engine.connect() as conn:
            found = tuple(i for i in allocation_ids if audit.written(conn, i, "attached", now))
    except DBAPIError:
        return None
    return found or None


def gpus_truth(
    state: ServiceState,
    job_id: str,
    owner: str,
    gpus: dict[str, list[int]],
    named: list[str],
    reason: str,
    started: bool = False,
    on: Mapping[str, NodeSnapshot] | None = None,
    touch: bool = False,
    run: int | None = None,
    by_task: tuple[str, ...] = (),
    confined: bool = False,
) -> ObservedJob:
    """A job's truth for ``observe_all``: ``job_id`` runs on ``gpus`` (node -> indices).
    ``started``: read as the job started (a prolog's), perhaps processed after it ended;
    ``touch``: its allocations stamped as used even where it matches them (``ObservedJob``);
    ``run``: which run of the job it is (a requeued Slurm job's restart count), stored
    with the placement it records. ``by_task``: owners (prefixes) whose allocations'
    tasks are each their own pod's; ``confined``: a node's own report (``ObservedJob``).
    ``on``: the snapshots to map indices on (the caller's, still
    those in memory; this replica's memory otherwise); the truth is recorded only while
    the node rows they were read with are the stored ones (``observe_all``)."""
    snapshots, rows = _snapshots(state, list(gpus), on)
    for node, indices in gpus.items():
        wrong = [i for i in indices if not 0 <= i < snapshots[node].gpu_count]
        if wrong or not indices:
            raise BadRequest(f"{node} has no GPU {wrong or '(none named)'}", {"node": node})
    holds = [(n, snapshots[n].gpus[i].uuid, "gpu") for n in sorted(gpus) for i in sorted(gpus[n])]
    placement = observed_placement(snapshots, gpus, reason)
    if run is not None:
        placement[RUN] = run
    placement_text = json.dumps(placement)
    counts = {len(v) for v in gpus.values()}
    request = PlaceRequest(
        gpus=max(counts), tasks=len(gpus), owner=owner, job_id=job_id
    ).model_dump_json()
    truth = _Truth(
        holds,
        _instances_of(snapshots, gpus),
        placement_text,
        request,
        tuple(sorted(gpus)),
        _sorted(rows),
    )
    return ObservedJob(job_id, owner, tuple(named), truth, started, touch, run, by_task, confined)


def _instances_of(
    snapshots: Mapping[str, NodeSnapshot], gpus: Mapping[str, list[int]]
) -> tuple[tuple[str, str], ...]:
    """The MIG instances of the GPUs a truth names whole: a GPU is held by its UUID and
    its instances by theirs, so the database alone would let a job hold a GPU whole while
    another holds one of its instances; their holders are stale too (``_take_truth``),
    as a holder of a parent GPU whole is for a truth of instances (``mig_truth``)."""
    return tuple(
        sorted(
            (node, m.uuid)
            for node, indices in gpus.items()
            for m in snapshots[node].mig_instances
            if m.parent_gpu in indices
        )
    )


def mig_truth(
    state: ServiceState,
    job_id: str,
    owner: str,
    node: str,
    mig_uuids: list[str],
    named: list[str],
    reason: str,
    on: Mapping[str, NodeSnapshot] | None = None,
    started: bool = False,
    by_task: tuple[str, ...] = (),
    confined: bool = False,
) -> ObservedJob:
    """A job's truth for ``observe_all``: ``job_id`` runs on these MIG instances of ``node``.
    Besides the allocations holding one of these instances, one holding a parent GPU
    whole is stale too (a GPU split into instances is not given whole), so neither is
    ever held twice. ``on``, ``started``, ``by_task`` and ``confined`` as for ``gpus_truth``."""
    snapshots, rows = _snapshots(state, [node], on)
    snapshot = snapshots[node]
    by_uuid = {m.uuid: m for m in snapshot.mig_instances}
    unknown = [u for u in mig_uuids if u not in by_uuid]
    if unknown or not mig_uuids:
        raise BadRequest(f"{node} has no MIG instance {unknown or '(none named)'}", {"node": node})
    if len(set(mig_uuids)) != len(mig_uuids):
        raise BadRequest(f"a MIG instance of {node} is named twice", {"node": node})
    chosen = [by_uuid[u] for u in sorted(mig_uuids)]
    profiles = sorted({m.profile for m in chosen})
    if len(profiles) != 1:
        raise BadRequest(
            f"MIG instances of one job must share a profile, not {', '.join(profiles)}",
            {"node": node},
        )
    holds = [(node, m.uuid, "mig") for m in chosen]
    parents = tuple(sorted({(node, snapshot.gpus[m.parent_gpu].uuid) for m in chosen}))
    placement_text = json.dumps(observed_mig_placement(snapshot, chosen, reason))
    request = PlaceRequest(
        gpus=1, tasks=len(chosen), mig_profile=profiles[0], owner=owner, job_id=job_id
    ).model_dump_json()
    truth = _Truth(holds, parents, placement_text, request, (node,), _sorted(rows))
    return ObservedJob(
        job_id, owner, tuple(named), truth, started, by_task=by_task, confined=confined
    )


def task_truth(
    state: ServiceState,
    allocation_id: str,
    task: int,
    node: str,
    gpus: list[int],
    reason: str,
    on: Mapping[str, NodeSnapshot] | None = None,
    *,
    job_id: str,
    by_task: tuple[str, ...] = (),
    confined: bool = False,
) -> ObservedTask:
    """A task's truth for ``observe_all``: task number ``task`` of live allocation
    ``allocation_id`` (a gang member's pod) runs on ``gpus`` of ``node`` rather than on
    the GPUs it holds. Its other tasks, and this task's CPUs, are kept. ``on`` as for
    ``gpus_truth``. ``job_id``: the job the allocation must be of (the gang of the pod
    that names it): the allocation is named by the pod's annotations, which whoever
    made the pod wrote, so an allocation of another job is not moved. ``by_task`` and
    ``confined`` as for ``gpus_truth``."""
    snapshots, rows = _snapshots(state, [node], on)
    snapshot = snapshots[node]
    wrong = [i for i in gpus if not 0 <= i < snapshot.gpu_count]
    if wrong or not gpus or len(set(gpus)) != len(gpus):
        raise BadRequest(f"{node} has no GPUs {wrong or gpus}", {"node": node})
    moved_task = observed_placement({node: snapshot}, {node: gpus}, reason)["tasks"][0]
    holds = [(node, snapshot.gpus[i].uuid, "gpu") for i in sorted(gpus)]
    instances = _instances_of({node: snapshot}, {node: gpus})
    return ObservedTask(
        allocation_id,
        task,
        node,
        holds,
        moved_task,
        rows[node],
        job_id,
        instances,
        by_task,
        confined,
    )


def _snapshots(
    state: ServiceState, nodes: list[str], on: Mapping[str, NodeSnapshot] | None = None
) -> tuple[dict[str, NodeSnapshot], dict[str, MappedOn]]:
    """The snapshots to map on, and the node rows as memory holds them then (one hold of
    the state lock: a sync between the two would pair a snapshot with another's row).
    The caller's (``on``) only while memory still holds them: else the row memory knows
    is another snapshot's, and ``NodeChanged`` has the caller read the node again."""
    with state.lock:
        if on is not None and all(n in on for n in nodes):
            moved = [n for n in nodes if not _holds_snapshot(state, on[n])]
            if moved:
                raise _changed_nodes(sorted(moved))
            return {n: on[n] for n in nodes}, {n: _row(state, n) for n in nodes}
        missing = [n for n in nodes if n not in state.cluster]
        if missing:
            raise NotFound(f"node(s) {', '.join(sorted(missing))} unknown to topoplace")
        return {n: state.cluster.node(n).snapshot for n in nodes}, {
            n: _row(state, n) for n in nodes
        }


def _holds_snapshot(state: ServiceState, snapshot: NodeSnapshot) -> bool:
    """Whether memory holds this snapshot of its node still (under the state lock)."""
    if snapshot.name not in state.cluster:
        return False
    held = state.cluster.node(snapshot.name).snapshot
    return held is snapshot or held == snapshot


def _row(state: ServiceState, node: str) -> MappedOn:
    """A node's row as memory holds it (under the state lock; the node is in memory)."""
    seq = state.cluster.node(node).snapshot.seq
    return MappedOn(seq, state.reported.get(node), node in state.cordoned)


def _sorted(rows: Mapping[str, MappedOn]) -> tuple[tuple[str, MappedOn], ...]:
    return tuple(sorted(rows.items(), key=lambda item: item[0]))


@dataclass(frozen=True)
class _Truth:
    """What a job really holds, as rows: its holds, other devices whose holders are stale
    too, its placement and request JSON, its nodes, and each node's row as its devices
    were named on (its holds name it: ``MappedOn``)."""

    holds: list[tuple[str, str, str]]
    also_stale: tuple[tuple[str, str], ...]
    placement: str
    request: str
    nodes: tuple[str, ...]
    on: tuple[tuple[str, MappedOn], ...]


@dataclass(frozen=True)
class ObservedJob:
    """One job's truth for ``observe_all`` (``gpus_truth``, ``mig_truth``).

    ``started``: the truth was read as the job started (a Slurm prolog's report), and
    may be processed after the job ended (a retry, a slow network). It is then taken
    only if the job's end was not said within TOPOPLACE_ENDED_JOB_MEMORY_S
    (``release_job(ended=True)``, ``release(ended_job=...)``) or one of the job's
    allocations is live (a job id given again: a new job's); else nothing is written
    and the job's observation is ``ended``. Nor is it taken when one of the job's live
    allocations was recorded for a later ``run`` (a requeued job's next run, whose
    report came first): it is an earlier run's, ended.

    ``touch``: the job's allocations are stamped as used now (``touch``) where the truth
    changes nothing in them (``matched``): a scheduler's report that the job has just
    started on them (a Slurm prolog's, of any run), which a release decided from an
    older view of the job (a reconcile's squeue answer that saw it held) must leave
    (``quiet``). Not for periodic reports (a node's devices): a write each time.

    ``by_task``: owners (prefixes) of allocations whose tasks are each a pod of its own
    (a Kubernetes gang's): such an allocation holding some of these devices, and others
    besides, gives up only those (service/allocations/stale_holders.py). The kubelet
    gave them to this job, so the task holding them has no container on them, while its
    other tasks hold the GPUs its running members use. Any other holder is ended whole,
    as a scheduler that runs a job on a device says the job that held it has ended.

    ``confined``: the truth is a node's own report (its agent token's, the device
    plugin's): it may change what that node holds and no other node's, so another job's
    allocation it would end whole that also holds devices on another node is not ended
    for it (``NotObserved``; ``_reaching``)."""

    job_id: str
    owner: str
    named: tuple[str, ...]
    truth: _Truth
    started: bool = False
    touch: bool = False
    run: int | None = None
    by_task: tuple[str, ...] = ()
    confined: bool = False

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.truth.nodes

    @property
    def on(self) -> dict[str, MappedOn]:
        return dict(self.truth.on)

    @property
    def label(self) -> str:
        return f"job {self.job_id}"

    @property
    def contested(self) -> list[tuple[str, str]]:
        """The devices whose other holders are stale: the job's, and ``also_stale``."""
        return sorted({(n, d) for n, d, _ in self.truth.holds} | set(self.truth.also_stale))


@dataclass(frozen=True)
class ObservedTask:
    """One task's truth for ``observe_all`` (``task_truth``): its new GPU holds on
    ``node`` and its placement there (CPUs and task number are kept from the old), and the
    node's row as its GPUs were named on."""

    allocation_id: str
    task: int
    node: str
    holds: list[tuple[str, str, str]]
    placement: dict[str, Any]
    mapped_on: MappedOn
    job_id: str  # the job the allocation must be of
    # The MIG instances of the GPUs it moves onto: their holders are stale too.
    instances: tuple[tuple[str, str], ...] = ()
    by_task: tuple[str, ...] = ()  # as ObservedJob's
    confined: bool = False  # as ObservedJob's: its own allocation may span nodes (a gang)

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node,)

    @property
    def on(self) -> dict[str, MappedOn]:
        return {self.node: self.mapped_on}

    @property
    def label(self) -> str:
        return f"task {self.task} of allocation {self.allocation_id}"

    @property
    def wanted(self) -> set[tuple[str, str]]:
        return {(n, d) for n, d, _ in self.holds}

    @property
    def contested(self) -> list[tuple[str, str]]:
        """The devices whose other holders are stale: the task's, and their instances."""
        return sorted(self.wanted | set(self.instances))


Truth = ObservedJob | ObservedTask


class NodeChanged(Conflict):
    """A truth's devices were named on a node row the database no longer holds (another
    replica stored a newer snapshot, deleted the node and stored it again, cordoned or
    uncordoned it; or this one did meanwhile): memory has been brought up to the
    database, and the caller names them again on it."""


def _changed_nodes(nodes: Sequence[str]) -> NodeChanged:
    return NodeChanged(
        f"node(s) {', '.join(nodes)} changed (a snapshot, a cordon) while a truth of them"
        " was recorded; name its devices again",
        {"nodes": list(nodes)},
    )


class _Changed(Exception):
    """A row read live in this transaction was ended by another one before it was
    relocated, or another task of it moved (the other node's report of a gang): the
    whole transaction is tried again on what is there now."""


@dataclass(frozen=True)
class _TaskPlan:
    """What a task's truth finds in the database before anything is written: the task's
    place in its allocation's placement and the devices it held then (``was``: its GPUs, or
    its MIG instances); or why it is not taken."""

    index: int = 0
    was: frozenset[str] = frozenset()
    refusal: ServiceError | None = None
    row: RowMapping | None = None  # the allocation as read, for its TTL


def observe_all(
    state: ServiceState,
    truths: Sequence[Truth],
    first: Callable[[Connection], None] | None = None,
) -> list[Observation | NotObserved]:
    """Several jobs (and gang tasks) run on what their truths say: make it so here, in
    one transaction, one answer per truth in order.

    ``first``, when given, runs first in that transaction (and in each try of it), even
    with no truths: the caller's own check and write, taken or refused with the truths.
    It raises to take nothing; the error goes to the caller.

    A job's live allocations are those carrying its id or ``named`` by it. When
    they hold exactly its devices, they only learn the job id. Otherwise the truth
    wins: any other allocation holding one of these devices is stale (the scheduler
    would not run two jobs on one GPU) and is released; the job's first allocation
    is relocated onto them (its others end), or one is created. A task's truth moves
    that task of its allocation alone, the same way; a task whose allocation ended,
    that is not on the node, or whose new GPUs another task of its own allocation
    holds and does not move off in the same call is not taken (``NotObserved``, the
    others are). Those that move give up their holds first, so two that swapped
    devices (two same-size pods, a pod and a gang member, or two members of one gang,
    the kubelet admitted the other way round) each keep their own
    allocation, and none is released as another's stale holder. A hold taken meanwhile
    by another replica fails the insert; the whole transaction is then tried again.
    Each hold names the node row its truth's devices were named on (``MappedOn``): a
    snapshot replaced since (a GPU gone, indices renumbered, MIG reconfigured, the node
    deleted and reported again under its old seq), or a cordon or uncordon memory had
    not heard of, fails the commit too, and then ``NodeChanged`` asks the caller to name
    them again on the row now in memory.
    """
    if not truths and first is None:
        return []

    def work(
        conn: Connection,
    ) -> tuple[list[Observation | NotObserved], list[repository.FreedHold]]:
        if first is not None:
            first(conn)
        if not truths:
            return [], []
        now = state.clock()
        ended = _ended_before_taken(conn, state, now, truths)
        taken = {i: t for i, t in enumerate(truths) if not _is_ended(t, ended)}
        # A node's own report that would end another node's holds: not taken.
        declined = {i: found for i, t in taken.items() if (found := _reaching(conn, t))}
        taken = {i: t for i, t in taken.items() if i not in declined}
        plans = _plan_tasks(conn, taken)
        freed = _give_up_moving(conn, taken, plans)
        answers: list[Observation | NotObserved] = []
        for i, truth in enumerate(truths):
            if i in declined:
                answers.append(_across_nodes(declined[i]))
                continue
            if i not in taken:
                answers.append(Observation("ended", ""))
                continue
            if isinstance(truth, ObservedTask):
                answer, given_up = _take_task(conn, now, truth, plans[i], len(taken) > 1)
            else:
                answer, given_up = _take_truth(conn, now, truth)
            answers.append(answer)
            freed += given_up
        if any(_changed(a) for a in answers):
            publish(conn, {h.node for h in freed} | _nodes(taken.values()))
        return answers, freed

    revoked_meanwhile.refuse_if_revoked()
    for attempt in range(OBSERVE_ATTEMPTS):
        try:
            with following(state):
                answers, freed = in_transaction(state.engine, work, state.metrics.retried)
            break
        except IntegrityError:
            _check_mapped_on_stored(state, truths)
            if attempt == OBSERVE_ATTEMPTS - 1:
                raise _kept_changing(truths) from None
        except _Changed:
            if attempt == OBSERVE_ATTEMPTS - 1:
                raise _kept_changing(truths) from None
    if any(_changed(a) for a in answers):
        state.sync_nodes(sorted({h.node for h in freed} | _nodes(truths)))
    return answers


def _check_mapped_on_stored(state: ServiceState, truths: Sequence[Truth]) -> None:
    """After a failed commit: memory made to match the database on the truths' nodes, and
    ``NodeChanged`` when a truth's devices were named on a row since changed (a snapshot
    replaced, a node deleted or reported again, a cordon); else the failure was a hold
    taken meanwhile, tried again."""
    state.sync_nodes(sorted(_nodes(truths)))
    with state.lock:
        changed = sorted(
            {
                node
                for truth in truths
                for node, mapped in truth.on.items()
                if node not in state.cluster or _row(state, node) != mapped
            }
        )
    if changed:
        raise _changed_nodes(changed)


def _kept_changing(truths: Sequence[Truth]) -> Conflict:
    labels = ", ".join(t.label for t in truths)
    first = truths[0]
    job_id = first.job_id if len(truths) == 1 and isinstance(first, ObservedJob) else labels
    return Conflict(
        f"the GPUs of {labels} kept being taken while recorded; retry", {"job_id": job_id}
    )


# The placement JSON's key for the run of its job a truth was recorded for (``gpus_truth``).
RUN = "run"

# Observations that change no hold.
_UNCHANGED = ("matched", "attached", "ended")


def _changed(answer: Observation | NotObserved) -> bool:
    return isinstance(answer, Observation) and answer.action not in _UNCHANGED


def _nodes(truths: Iterable[Truth]) -> set[str]:
    return {n for t in truths for n in t.nodes}


def _ended_before_taken(
    conn: Connection, state: ServiceState, now: datetime, truths: Sequence[Truth]
) -> set[str]:
    """The ``started`` jobs whose end was said already, and none of whose allocations is
    live: their truth is older than their end; and the jobs whose truth names an earlier
    ``run`` than one of their live allocations was recorded for. Read after holding the
    jobs (ended_jobs.lock), first in the transaction, so that an end said on another
    replica either committed before this read or waits for this transaction and then
    ends what it wrote."""
    starting = [t for t in truths if _of_a_start(t)]
    if not starting:
        return set()
    since = now - timedelta(seconds=state.settings.ended_job_memory_s)
    ended_jobs.lock(conn, [job.job_id for job in starting], since)
    ended: set[str] = set()
    for job in starting:
        said = job.started and ended_jobs.ended_since(conn, job.job_id, since)
        if not said and job.run is None:
            continue
        live = repository.live_for_job(conn, job.job_id, list(job.named))
        if (said and not live) or _later_run_live(live, job.run):
            ended.add(job.job_id)
    return ended


def _of_a_start(truth: Truth) -> TypeGuard[ObservedJob]:
    """A job's truth read as a run of it started: perhaps older than its end, or than a
    later run's."""
    return isinstance(truth, ObservedJob) and (truth.started or truth.run is not None)


def _later_run_live(live: Sequence[RowMapping], run: int | None) -> bool:
    """Whether one of these live allocations was recorded for a later run of the job than
    ``run`` (a requeued job's next run, reported first): a report of ``run`` is then of
    a run that has ended, and moving the job back onto its GPUs would release their
    holder and leave the GPUs the job runs on looking free."""
    if run is None:
        return False
    for row in live:
        recorded = json.loads(str(row["placement"])).get(RUN)
        if isinstance(recorded, int) and recorded > run:
            return True
    return False


def _is_ended(truth: Truth, ended: set[str]) -> bool:
    """A started job's truth found older than its end (``_ended_before_taken``)."""
    return _of_a_start(truth) and truth.job_id in ended


def _plan_tasks(conn: Connection, truths: Mapping[int, Truth]) -> dict[int, _TaskPlan]:
    """The task truths' plans (``_plan_task``), read before anything is written. A task
    moving onto devices another task of its allocation holds is refused, unless that
    task moves off them in this same call (two members of one gang the kubelet admitted
    onto each other's GPUs, or one given GPUs the other's task leaves): those holds are
    given up first (``_give_up_moving``). Refusing it while the other moved left the
    GPUs its member runs on held by nobody. Settled until no refusal changes another."""
    plans: dict[int, _TaskPlan] = {}
    own: dict[int, set[tuple[str, str]]] = {}
    for i, truth in truths.items():
        if isinstance(truth, ObservedTask):
            plans[i], own[i] = _plan_task(conn, truth)
    while True:
        leaving = {
            (truth.allocation_id, truth.node, d)
            for i, plan in plans.items()
            if _moves(plan, truth := _task_truth(truths[i]))
            for d in plan.was
        }
        refused = [
            i
            for i, plan in plans.items()
            if plan.refusal is None
            and own[i]
            and not all((_task_truth(truths[i]).allocation_id, n, d) in leaving for n, d in own[i])
        ]
        if not refused:
            return plans
        for i in refused:
            truth = _task_truth(truths[i])
            message = (
                f"another task of allocation {truth.allocation_id} holds"
                f" {sorted(d for _, d in own[i])}"
            )
            plans[i] = _TaskPlan(refusal=Conflict(message, {"id": truth.allocation_id}))


def _task_truth(truth: Truth) -> ObservedTask:
    assert isinstance(truth, ObservedTask)
    return truth


def _plan_task(conn: Connection, truth: ObservedTask) -> tuple[_TaskPlan, set[tuple[str, str]]]:
    """Read what a task's truth moves, and whether it may: before anything is written.
    With the plan, the devices it moves onto that other tasks of its allocation hold
    (``_plan_tasks`` refuses it unless those move off them in the same call)."""
    allocation_id, node = truth.allocation_id, truth.node
    row = repository.by_id(conn, allocation_id)
    tasks: list[dict[str, Any]] = []
    if row is not None and row["state"] in repository.LIVE and row["job_id"] == truth.job_id:
        tasks = json.loads(str(row["placement"]))["tasks"]
    found = [i for i, t in enumerate(tasks) if t["task"] == truth.task and t["node"] == node]
    if not found:
        # One answer whether the allocation does not exist, has ended, is another job's or
        # has no such task on this node: the id is the pod's annotation, which whoever made
        # the pod wrote, and the node's agent hears the refusal; told apart, they would let
        # it probe which allocation ids exist and are live.
        refusal: ServiceError = NotFound(
            f"the allocation named is no live allocation of the pod's own gang with task"
            f" {truth.task} on {node}: nothing moved",
            {"id": allocation_id},
        )
        return _TaskPlan(refusal=refusal), set()
    # The devices the task holds: its MIG instances where it has them (its GPU is then
    # only their parent, held by no hold of its own), else its GPUs.
    old = tasks[found[0]]
    was = frozenset(str(d) for d in (old.get("mig_uuids") or old["gpu_uuids"]))
    plan = _TaskPlan(found[0], was, row=row)
    if was == {d for _, d in truth.wanted}:
        return plan, set()  # moved before: nothing to do
    # Another task's instance of a GPU it moves onto counts too: the GPU's pool would
    # refuse its whole hold on every try.
    own = {(n, d) for n, d, _ in _kept(conn, plan, truth)} & (truth.wanted | set(truth.instances))
    return plan, own


def _moves(plan: _TaskPlan, truth: ObservedTask) -> bool:
    return plan.refusal is None and plan.was != {d for _, d in truth.wanted}


def _kept(conn: Connection, plan: _TaskPlan, truth: ObservedTask) -> list[tuple[str, str, str]]:
    """The allocation's holds but the task's old GPUs or MIG instances: its other
    tasks', and CPUs."""
    return [
        h
        for h in repository.holds_with_kind(conn, truth.allocation_id)
        if not (h[0] == truth.node and h[2] in ("gpu", "mig") and h[1] in plan.was)
    ]


def _take_task(
    conn: Connection, now: datetime, truth: ObservedTask, plan: _TaskPlan, dropped: bool
) -> tuple[Observation | NotObserved, list[repository.FreedHold]]:
    allocation_id = truth.allocation_id
    if plan.refusal is not None:
        return NotObserved(allocation_id, plan.refusal.message), []
    if not _moves(plan, truth):
        # Nothing moves, yet the member runs: a gang's reservation still pending loses
        # its TTL here too, or the sweep ends it under the running members.
        if plan.row is not None:
            _runs(conn, [plan.row], now)
        return Observation("matched", allocation_id), []
    # Read again: another task of the allocation may have moved in this transaction.
    row = repository.by_id(conn, allocation_id)
    if row is None or row["state"] not in repository.LIVE:
        raise _Changed(allocation_id)
    placement = json.loads(str(row["placement"]))
    tasks = list(placement["tasks"])
    old = tasks[plan.index]
    # The task's CPUs stay its own (their holds are kept): only its GPUs move.
    tasks[plan.index] = {
        **truth.placement,
        "task": old["task"],
        "cpuset": old.get("cpuset", ""),
        "cpus": old.get("cpus", []),
    }
    # With other truths in the call its old devices were given up first
    # (``_give_up_moving``): every hold left is the other tasks' (one of which may have
    # moved onto a device this task left) or CPUs. Alone, they are still its own.
    kept = repository.holds_with_kind(conn, allocation_id) if dropped else _kept(conn, plan, truth)
    superseded, freed = _end_stale(conn, truth, {allocation_id}, now)
    moved, given_up = repository.relocate(
        conn,
        allocation_id,
        now,
        job_id=row["job_id"],
        placement=json.dumps({**placement, "tasks": tasks}),
        holds=[*truth.holds, *kept],
        on=truth.on,
        placed=str(row["placement"]),  # the other tasks' as read: none moved since
    )
    if moved is None:
        raise _Changed(allocation_id)
    # A member runs on the task: a gang's reservation still pending (its first member's
    # confirm failed) loses its TTL, or the sweep ends it under the running members.
    moved = _runs(conn, [row], now).get(allocation_id, moved)
    audit.write_allocations(conn, "released", superseded, now)
    audit.write(conn, [records.allocation_change("moved", now, moved)])
    return Observation("moved", allocation_id, tuple(superseded)), freed + given_up


def _give_up_moving(
    conn: Connection, truths: Mapping[int, Truth], plans: dict[int, _TaskPlan]
) -> list[repository.FreedHold]:
    """The holds of each allocation (or task) about to move, dropped before any truth
    takes its devices: a device one leaves is then free for another of the same call
    instead of making its holder look stale."""
    if len(truths) < 2:
        return []
    moving = []
    freed: list[repository.FreedHold] = []
    for i, truth in truths.items():
        if isinstance(truth, ObservedTask):
            plan = plans[i]
            if _moves(plan, truth):
                devices = [(truth.node, d) for d in sorted(plan.was)]
                freed += repository.drop_devices(conn, truth.allocation_id, devices)
            continue
        ids = [str(r["id"]) for r in repository.live_for_job(conn, truth.job_id, list(truth.named))]
        if ids and repository.holds_of(conn, ids) != set(truth.truth.holds):
            moving.append(ids[0])
    return freed + repository.drop_holds(conn, moving)


def _take_truth(
    conn: Connection, now: datetime, job: ObservedJob
) -> tuple[Observation, list[repository.FreedHold]]:
    job_id, owner, truth = job.job_id, job.owner, job.truth
    rows = repository.live_for_job(conn, job_id, list(job.named))
    ids = [str(r["id"]) for r in rows]
    # Kinds compared too: a scheduler's truth is of whole GPUs (or MIG instances), and a
    # job holding a share of the GPU it runs on was matched, the GPU's other shares kept
    # and more given on it, where a job without one superseded them.
    if ids and repository.holds_of(conn, ids) == set(truth.holds):
        _runs(conn, rows, now)
        attached = tuple(repository.attach(conn, ids, job_id, now))
        if job.touch:
            # The scheduler has just said the job started on these (attached or not):
            # stamped, so that a release decided from an older view of the job (a Slurm
            # reconcile's squeue answer that saw it held, finished or absent) leaves
            # them (``quiet``). One such release that committed after this transaction
            # read the job's holds leaves nothing to stamp: answered ``matched``, the
            # GPUs the job runs on were free, so the truth is taken again on what is left.
            for allocation_id in ids:
                if repository.touch(conn, allocation_id, now) is None:
                    raise _Changed(allocation_id)
        if attached:
            audit.write_allocations(conn, "attached", attached, now)
            return Observation("attached", ids[0], attached=attached), []
        return Observation("matched", ids[0]), []
    superseded, freed = _end_stale(conn, job, set(ids), now)
    merged, freed_merged = repository.end(conn, ids[1:], "release", now)
    freed += freed_merged
    moved = None
    if ids:
        moved, given_up = repository.relocate(
            conn,
            ids[0],
            now,
            job_id=job_id,
            placement=truth.placement,
            holds=truth.holds,
            on=job.on,
        )
        freed += given_up
        if moved is not None:
            moved = _runs(conn, rows[:1], now).get(ids[0], moved)
        if moved is not None and job.touch:
            # Moved onto the GPUs the job has just started on: as for a match, an older
            # view of the job (a stale squeue answer) must not end it (``quiet``).
            moved = repository.touch(conn, ids[0], now) or moved
    # Audit rows in the events' order (api.observe): what ended, then the job's own.
    audit.write_allocations(conn, "released", [*superseded, *merged], now)
    if moved is not None:
        observation = Observation("moved", ids[0], tuple(superseded), tuple(merged))
        audit.write(conn, [records.allocation_change("moved", now, moved)])
    else:
        row = _observed_row(job_id, owner, truth.request, truth.placement, truth.holds, now)
        repository.insert(conn, row, truth.holds, job.on)
        observation = Observation("created", str(row["id"]), tuple(superseded), tuple(merged))
        placed = records.placed(
            now, str(row["id"]), job_id, truth.nodes, "active", truth.request, truth.placement
        )
        audit.write(conn, [placed])
    return observation, freed


def _reaching(conn: Connection, truth: Truth) -> str | None:
    """For a ``confined`` truth (a node's own report): an allocation of another job that
    taking it would end whole as stale and that holds devices on another node too; None
    when there is none (service/allocations/stale_holders.py)."""
    if not truth.confined:
        return None
    if isinstance(truth, ObservedTask):
        own = {truth.allocation_id}
    else:
        # The job's own allocations move with it (the pod runs on this node, as the
        # Kubernetes API says): only another job's, ended as stale, is judged.
        rows = repository.live_for_job(conn, truth.job_id, list(truth.named))
        own = {str(r["id"]) for r in rows}
    found = stale_holders.beyond(conn, _stale(conn, truth, own), truth.nodes)
    return found[0] if found else None


def _stale(conn: Connection, truth: Truth, own: set[str]) -> stale_holders.Split:
    """The holders of the devices the truth takes, but its own allocations ``own``."""
    held = repository.holders(conn, truth.contested)
    stale = {a: devices for a, devices in held.items() if a not in own}
    return stale_holders.split(conn, stale, truth.by_task)


def _end_stale(
    conn: Connection, truth: Truth, own: set[str], now: datetime
) -> tuple[list[str], list[repository.FreedHold]]:
    """End the holders ``_stale`` finds (``stale_holders.end``). A confined truth's that
    reach another node were found since ``_reaching`` looked: the transaction is run
    again, and declines the truth then."""
    found = _stale(conn, truth, own)
    if truth.confined and (reaching := stale_holders.beyond(conn, found, truth.nodes)):
        raise _Changed(reaching[0])
    return stale_holders.end(conn, found, now)


def _across_nodes(allocation_id: str) -> NotObserved:
    """Not named in the message: the reporting node's token learns no allocation of other
    nodes (docs/kubernetes.md)."""
    return NotObserved(
        allocation_id,
        "another job's allocation holds these devices, and devices of another node too: a"
        " node's report does not end it (its scheduler releases it)",
    )


def _runs(conn: Connection, rows: Sequence[RowMapping], now: datetime) -> dict[str, RowMapping]:
    """The scheduler says the job runs on these allocations' GPUs: a reservation among
    them loses its TTL (pending -> active). Left pending, a REST reservation pinned to a
    job expired under it at its TTL, and the GPUs the job runs on went to the next one.
    Only rows read with a TTL are written (a job's active allocation, the usual case,
    costs no statement). Returns the rows that changed, by id. A row ended since it was
    read (its TTL passed and the sweep, here or on another replica, expired it between
    this transaction's read of the job's holds and this statement) raises ``_Changed``:
    answered ``matched``, the GPUs the job runs on were left free for the next /place."""
    changed: dict[str, RowMapping] = {}
    for allocation_id in [str(r["id"]) for r in rows if r["expires_at"] is not None]:
        row = repository.run(conn, allocation_id, now)
        if row is None:
            current = repository.by_id(conn, allocation_id)
            if current is None or current["state"] not in repository.LIVE:
                raise _Changed(allocation_id)
            continue  # confirmed meanwhile: live, without a TTL, as this would leave it
        changed[allocation_id] = row
        audit.write(conn, [records.allocation_change("confirmed", now, row)])
    return changed


def _observed_row(
    job_id: str,
    owner: str,
    request: str,
    placement_text: str,
    holds: list[tuple[str, str, str]],
    now: datetime,
) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "state": "active",  # the job runs: no TTL, it ends with the job
        "job_id": job_id,
        "owner": owner,
        "idempotency_key": None,
        "request": request,
        **host_figures(request),
        "placement": placement_text,
        "created_at": now,
        "expires_at": None,
        "ended_at": None,
        "live": True,
        "anchor_node": holds[0][0],
        "anchor_device": holds[0][1],
    }
