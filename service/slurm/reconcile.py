"""Release allocations of jobs Slurm no longer has, so nothing leaks when an epilog is missed.

Slurm's view comes from ``squeue --json`` (run by the service where
``TOPOPLACE_SLURM_SQUEUE_COMMAND`` is set, or pushed to POST
/v1/slurm/reconcile by a cron job on a host that has the Slurm client).
An allocation made by the filter (owner ``slurm:<user>``) is live while a
job that is not finished names it in its admin comment. Allocations younger
than squeue's answer (the moment it was asked) by the grace period are left
alone: the job they were made for may not be in that answer (the filter
reserves before slurmctld creates the job, and squeue may print slowly). A
pushed answer arrives after squeue has finished: pushed.py says when it counts
as taken.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from service.allocations import api as allocations
from service.allocations.results import Allocation
from service.audit.actor import acting, service_task
from service.errors import BadRequest, Conflict, NotFound
from service.event_loop import off_loop
from service.slurm import truth
from service.slurm.fresh import FRESH
from service.slurm.json_command import run_json_command
from service.slurm.parked import parked_reason
from service.slurm.schemas import ReconcileResult
from service.slurm.service import OWNER_PREFIX
from service.slurm.settings import SlurmSettings
from service.state import ServiceState
from slurm_formats.admin_comment import allocation_ids

log = logging.getLogger("topoplace.slurm")
RECONCILER = service_task("slurm reconciler")

# Job states after which a job holds nothing (squeue keeps showing such jobs for MinJobAge).
FINISHED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
# States in which a job holds its GPUs on its nodes.
RUNNING = frozenset({"RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "STOPPED"})
COMPLETING = "COMPLETING"  # running no more: its allocation is kept, never recorded
_LISTED = 10_000  # allocations of one job id looked at (a job has a few)
EARLY_GAP_S = 0.1


def _states(job: dict[str, Any]) -> set[str]:
    value = job.get("job_state")
    # API v0.0.38 gives a string, later ones a list of flags.
    values = value if isinstance(value, list) else [value]
    return {str(v).upper() for v in values if v}


def _jobs(squeue: Any) -> list[dict[str, Any]]:
    if not isinstance(squeue, dict) or not isinstance(squeue.get("jobs"), list):
        raise BadRequest("expected the output of `squeue --json`: an object with a 'jobs' list")
    if errors := squeue.get("errors"):
        # squeue exits 0 with an empty job list and an error when slurmctld does not
        # answer: read as it stands, every Slurm allocation would look orphaned.
        raise BadRequest(f"squeue could not read the jobs: {_errors_text(errors)}")
    return [job for job in squeue["jobs"] if isinstance(job, dict)]


def _errors_text(errors: Any) -> str:
    """squeue's ``errors`` list in a line: ``description (source)`` for each."""
    if not isinstance(errors, list):
        return str(errors)[:300]
    return "; ".join(
        f"{e.get('description') or e.get('error')} ({e.get('source')})"
        if isinstance(e, dict)
        else str(e)
        for e in errors
    )[:300]


def parked(job: dict[str, Any]) -> str | None:
    """Why a pending job will not start without a change (service/slurm/parked.py)."""
    return parked_reason(job) if "PENDING" in _states(job) else None


def _holds_nothing(job: dict[str, Any]) -> bool:
    """A finished job, or a pending one that will not start as it stands: neither
    keeps a reservation."""
    return bool(_states(job) & FINISHED) or parked(job) is not None


def live_allocations(squeue: Any) -> tuple[set[str], int]:
    """(allocation ids named by unfinished jobs that may start or run, how many such jobs)."""
    live: set[str] = set()
    jobs = 0
    for job in _jobs(squeue):
        if _holds_nothing(job):
            continue
        ids = allocation_ids(str(job.get("admin_comment") or ""))
        if ids:
            live.update(ids)
            jobs += 1
    return live, jobs


Stamp = tuple[str | None, str, datetime | None, dict[str, tuple[int, ...]]]


def stamp(allocation: Allocation) -> Stamp:
    """What a job's start changes in an allocation (its job id, state, expiry, GPUs)."""
    return (allocation.job_id, allocation.state, allocation.expires_at, allocation.gpus_by_node())


def stamps(state: ServiceState) -> dict[str, Stamp]:
    """Live allocations as they stand now, to compare with after squeue answers."""
    return {a.id: stamp(a) for a in allocations.live(state)}


def _held(allocation: Allocation) -> dict[str, list[int]]:
    return {node: list(gpus) for node, gpus in allocation.gpus_by_node().items()}


def _ended_since(state: ServiceState, found: truth.JobTruth, taken_at: datetime) -> bool:
    """Whether an allocation of the job (carrying its id, or named by it) ended after
    squeue's answer was taken: the service has heard of the job since (its epilog, most
    often), so the answer is older than what the service knows."""
    mine = [
        *allocations.listing(state, found.job_id, None, None, _LISTED),
        *allocations.by_ids(state, found.named),
    ]
    return any(a.ended_at is not None and a.ended_at >= taken_at for a in mine)


def _changed_since(
    state: ServiceState,
    current: list[Allocation],
    found: truth.JobTruth,
    taken_at: datetime,
    before: dict[str, Stamp] | None,
) -> bool:
    """Whether an allocation of the job (carrying its id, or named by it) was made or
    changed after squeue's answer was taken (a prolog's report of a later run moved it
    there): the answer is older than what the service knows of the job. A pushed answer
    has no stamps (``before``): a prolog's report stamps what it attaches, moves or
    matches as used (``used_since``), which tells the same."""
    mine = [a for a in current if a.job_id == found.job_id or a.id in found.named]
    if any(
        a.created_at > taken_at or (before is not None and before.get(a.id) != stamp(a))
        for a in mine
    ):
        return True
    return bool(allocations.used_since(state, [a.id for a in mine], taken_at))


def _running_nodes(jobs: list[dict[str, Any]]) -> set[str]:
    """The nodes running jobs hold GPUs on, of those jobs that can be read (the others
    are skipped with a warning where they are taken in)."""
    nodes: set[str] = set()
    for job in jobs:
        if _states(job) & RUNNING:
            with contextlib.suppress(ValueError):
                nodes.update(truth.from_squeue_job(job).gpus)
    return nodes


def _take_in(
    state: ServiceState,
    job: dict[str, Any],
    taken_at: datetime,
    held_by_job: dict[str, dict[str, list[int]]],
    without_job: set[str],
    observed: list[str],
    attached: list[str],
    changed: Callable[[truth.JobTruth], bool],
) -> None:
    """One unfinished job: record the GPUs it runs on where the service says otherwise,
    or give its job id to the reservations it names. ``changed``: whether the job's
    allocations changed after the answer was taken (``_changed_since``)."""
    found = truth.from_squeue_job(job)
    # A completing job is leaving its GPUs: slurmctld shows it so, with them, until its
    # EpilogSlurmctld and every node's epilog are done, seconds after topoplace's epilog
    # released it. It starts on none: recorded, it would take them back from the
    # reservation made on them since, and free them again once it is gone.
    states = _states(job)
    running = bool(states & RUNNING) and COMPLETING not in states and found.gpus
    if running and held_by_job.get(found.job_id) != {
        n: g for n, g in found.gpus.items() if n in state.cluster
    }:
        if _ended_since(state, found, taken_at) or changed(found):
            # Recorded, if it still runs so, from the next answer: recorded from this one
            # it would move the job back over GPUs since given to another.
            return
        observation = truth.record(state, found, heard=True)
        if observation is not None and observation.action != "matched":
            (attached if observation.action == "attached" else observed).append(
                observation.allocation_id
            )
    elif unattached := [i for i in found.named if i in without_job]:
        attached.extend(allocations.attach(state, unattached, found.job_id))


def reconcile(
    state: ServiceState,
    settings: SlurmSettings,
    squeue: Any,
    taken_at: datetime | None = None,
    before: dict[str, Stamp] | None = None,
) -> ReconcileResult:
    """Make the service say what Slurm runs, and release what no job holds.

    - A running job's GPUs (``gres_detail``) are recorded as its allocation when the
      service says otherwise (truth.record): the prolog's backstop.
    - A filter's allocation (owner ``slurm:<user>``) is live while an unfinished job
      names it in its admin comment or carries its job id; a job that is finished
      (cancelled while pending included) releases it at once.
    - A pending job that will not start as it stands (held, or blocked: parked.py)
      gives its reservations back at once; its start is recorded when it comes.
    - One that no unfinished job names or carries is released once older than squeue's
      answer by the grace period (the filter reserves a moment before slurmctld
      creates the job).

    ``taken_at``: when squeue was asked (now, by default). Its answer is that old: a job
    created after it is missing from it, so only allocations older than it by the
    grace period can be orphans, whatever job id they have learned since.
    ``before``: the live allocations' stamps when squeue was asked (None: as now); one
    changed since (a prolog gave it its job id) is not released as a parked job's, nor
    is one a prolog's report matched since (``touch``: ``quiet``), and a job whose
    allocations changed since is not recorded from this answer (``_changed_since``).
    Every release here is ``quiet`` from ``taken_at``: a finished job's allocation or
    an orphan that a prolog's report attached, matched or moved since (a requeued
    job's next run, a job that took the reservation) is left to a later answer.
    """
    taken_at = taken_at or state.clock()
    cutoff = taken_at - timedelta(seconds=settings.reconcile_grace_s)
    jobs = _jobs(squeue)
    # Once for the whole answer, not once a job: nodes another replica stored meanwhile.
    truth.hear_of(state, _running_nodes(jobs))
    live_named, jobs_named = live_allocations(squeue)
    unfinished = {str(j.get("job_id")) for j in jobs if not _holds_nothing(j)}
    # Held or blocked (parked.py): their reservations go back to the others now; the
    # job is not over, so nothing is remembered of it and its start is recorded.
    parked_jobs = {str(j.get("job_id")): why for j in jobs if (why := parked(j)) is not None}
    named_by_parked = {
        i: str(j.get("job_id"))
        for j in jobs
        if str(j.get("job_id")) in parked_jobs
        for i in allocation_ids(str(j.get("admin_comment") or ""))
    }
    finished = [j for j in jobs if _states(j) & FINISHED]
    finished_named = {
        i for j in finished for i in allocation_ids(str(j.get("admin_comment") or ""))
    }
    # Allocation id -> the finished job naming it (a job with an id).
    named_by_finished = {
        i: str(j.get("job_id"))
        for j in finished
        if truth.ascii_digits(str(j.get("job_id")))
        for i in allocation_ids(str(j.get("admin_comment") or ""))
    }
    finished_ids = {str(j.get("job_id")) for j in finished} - unfinished
    current = allocations.live(state)
    held_by_job: dict[str, dict[str, list[int]]] = {}
    for allocation in current:
        if allocation.job_id is not None:
            merged = held_by_job.setdefault(allocation.job_id, {})
            for node, gpus in _held(allocation).items():
                merged[node] = sorted({*merged.get(node, []), *gpus})
    without_job = {a.id for a in current if a.job_id is None}
    observed: list[str] = []
    attached: list[str] = []
    for job in jobs:
        if _holds_nothing(job):
            continue
        try:
            _take_in(
                state,
                job,
                taken_at,
                held_by_job,
                without_job,
                observed,
                attached,
                partial(_changed_since, state, current, taken_at=taken_at, before=before),
            )
        except (ValueError, BadRequest, Conflict, NotFound) as exc:
            # One job Slurm shows in terms the service cannot record (a GPU its node's
            # snapshot lacks, text it cannot read, a node deleted while it was recorded)
            # is left as it is, its allocations kept: the others' records and releases go
            # on.
            log.warning("reconcile: job %s not recorded: %s", job.get("job_id"), exc)
    if observed:
        current = allocations.live(state)
    released: list[str] = []
    parked_released: dict[str, list[str]] = {}  # job id -> its allocations released
    for allocation in current:
        if not (allocation.owner or "").startswith(OWNER_PREFIX):
            continue
        allocation_id = allocation.id
        job_id = allocation.job_id
        if allocation_id in live_named or (job_id is not None and job_id in unfinished):
            continue
        if allocation.created_at > taken_at:
            # Recorded after squeue answered (a prolog's report of a job released from
            # its hold, or of a requeued job's next run): the answer cannot speak for it.
            continue
        parked_job = named_by_parked.get(allocation_id) or (
            job_id if job_id in parked_jobs else None
        )
        if parked_job is not None:
            if before is not None and before.get(allocation_id) != stamp(allocation):
                continue  # the job started after the answer (its prolog's report)
            # quiet: nor where a report of the job's start matched the allocation after
            # the answer was taken, changing nothing the stamp shows (lifecycle's touch).
            gone = allocations.release(state, allocation_id, quiet=taken_at).ids
            if gone:
                parked_released.setdefault(parked_job, []).extend(gone)
            continue
        # A job squeue shows finished ends its allocations now; any other allocation
        # no live job holds may belong to a job newer than squeue's answer (its job id
        # learned from the prolog meanwhile), unless it is older than that answer.
        ended = allocation_id in finished_named or job_id in finished_ids
        if ended or allocation.created_at <= cutoff:
            # The job it carries (no unfinished one) or the finished one naming it has
            # ended: remembered with the release, so that a report of its start processed
            # after this (a late prolog) records nothing. An orphan names no job.
            ended_job = job_id if job_id is not None else named_by_finished.get(allocation_id)
            # quiet: not one a report of a job's start used after the answer was taken
            # (a requeued job's next run, a job that took the reservation): the answer
            # is older than that run, and its GPUs would go to another job.
            released += allocations.release(
                state, allocation_id, quiet=taken_at, ended_job=ended_job
            ).ids
    if released:
        log.info("reconcile: released %d allocation(s) of jobs Slurm no longer has", len(released))
    for parked_job, ids in parked_released.items():
        log.info(
            "reconcile: job %s is pending and will not start as it stands (%s): its"
            " allocation(s) %s released; its start will be recorded",
            parked_job,
            parked_jobs[parked_job],
            ",".join(ids),
        )
        released += ids
    return ReconcileResult(
        released=released, live_jobs=jobs_named, observed=observed, attached=attached
    )


async def read_squeue(command: str, timeout_s: float) -> Any:
    """Run the configured command and parse its JSON; raises RuntimeError saying what failed.
    Cancelled (the service shutting down), it kills the command (json_command.py)."""
    squeue = await run_json_command(command, timeout_s)
    try:
        _jobs(squeue)
    except BadRequest as exc:
        raise RuntimeError(f"{command!r}: {exc.message}") from exc
    return squeue


class Reconciler:
    """The background loop's Slurm step: every interval, and as soon as a reservation
    this process made passes the grace period (was it taken by a job?)."""

    def __init__(self, state: ServiceState, settings: SlurmSettings | None = None) -> None:
        self.state = state
        self.settings = settings or SlurmSettings()
        self._command = self.settings.command()
        self._next = 0.0
        self._last = float("-inf")

    async def tick(self) -> None:
        command = self._command
        if not command:
            # squeue is pushed: no loop runs early, so the filter's notes are dropped
            # here, or the note of every reservation would be kept for good.
            FRESH.due(0)
            return
        now = time.monotonic()
        # Early runs at most once per grace period (and 0.1 s): under a stream of
        # submissions squeue is read twice a second at the default grace, not per job.
        early = now >= self._last + max(self.settings.reconcile_grace_s, EARLY_GAP_S)
        if now < self._next and not (early and FRESH.due(self.settings.reconcile_grace_s)):
            return
        self._last = now
        self._next = now + self.settings.reconcile_interval_s
        taken_at = self.state.clock()  # squeue's answer is no newer than this
        before = await off_loop(stamps, self.state)
        started = time.perf_counter()
        try:
            squeue = await read_squeue(command, self.settings.squeue_timeout_s)
        except RuntimeError as exc:
            # Never release on a failed read: an empty answer would free every GPU.
            self.state.metrics.squeue.labels("failed").observe(time.perf_counter() - started)
            log.warning("reconcile skipped: %s", exc)
            return
        self.state.metrics.squeue.labels("ok").observe(time.perf_counter() - started)
        with acting(RECONCILER):  # the audit log's actor of what it changes
            await off_loop(reconcile, self.state, self.settings, squeue, taken_at, before)
