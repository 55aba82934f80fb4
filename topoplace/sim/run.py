"""One simulation: jobs through one policy in simulated time, and what it measures.

Two protocols:

- ``timed``: jobs arrive at their submit times and leave after their
  durations; a job that does not fit waits in a FIFO queue and is retried
  whenever GPUs are released (a later job of another shape may start first:
  backfill, as kube-scheduler's retry queue and Slurm's backfill do). Jobs
  still waiting at the end count as never started.
- ``fill`` (FGD's protocol, ATC '23): jobs in order, nothing released, the
  list replayed from its start until the first job that does not fit; then
  on to the end of that pass, skipping what does not fit.

Every job, CPU-only ones included, takes its CPU and memory on the node it
lands on and gives them back when it ends; a job that does not fit (GPUs,
CPU or memory) is a failure, whatever it lacked.

Measured: GPU allocation rate (allocated GPU capacity, shares counted as
their fraction, over the fleet's) over time; at the first failure the
unallocated GPUs; queueing delay p50/p99 (timed); the share of multi-GPU
jobs on an NVLink-connected set and their predicted bus bandwidth (the
ring bottleneck, GB/s); stranded multi-node NVLink cliques (a clique with
free GPUs but no whole tray free); the causes of failed attempts; and the
fragmentation: FGD's expected fragmentation of the free capacity under the
trace's task mix (CPU and memory included), as a share of the free
capacity; and the CPU allocation rate at the end (nodes with a known CPU
capacity).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.fgd import UNLIMITED, Fragmentation
from placement import NodeSnapshot
from topoplace.sim.jobs import FULL, Job
from topoplace.sim.policies import Placed, Policy, task_mix

SAMPLES = 120
MAX_PASSES = 20

Progress = Callable[[int, int], None]  # (done, total)


@dataclass
class SimResult:
    policy: str
    mode: str
    total_gpus: int
    jobs: int = 0
    started: int = 0
    never_started: int = 0
    first_failure_at: float | None = None  # time (timed) or job position (fill)
    unallocated_at_failure: float | None = None
    failed_job: Job | None = None
    timeline: list[tuple[float, float, float]] = field(default_factory=list)  # x, rate, frag
    delays: list[float] = field(default_factory=list)
    multi: int = 0
    multi_nvlink: int = 0
    multi_rings: list[float] = field(default_factory=list)
    stranded_cliques: int = 0
    stranded_gpus: int = 0
    causes: Counter[str] = field(default_factory=Counter)
    end_rate: float = 0.0
    cpu_jobs: int = 0  # CPU-only jobs replayed
    cpu_started: int = 0
    end_cpu_rate: float | None = None  # None: no node has a known CPU capacity
    seconds: float = 0.0
    truncated: bool = False

    @property
    def nvlink_share(self) -> float:
        return self.multi_nvlink / self.multi if self.multi else float("nan")

    @property
    def mean_ring(self) -> float:
        return float(np.mean(self.multi_rings)) if self.multi_rings else float("nan")

    def delay(self, q: float) -> float:
        return float(np.percentile(self.delays, q)) if self.delays else float("nan")


class _Meter:
    """Allocation and fragmentation figures of one policy as the run goes."""

    def __init__(
        self, policy: Policy, snapshots: Sequence[NodeSnapshot], jobs: Sequence[Job]
    ) -> None:
        self.policy = policy
        self.capacity = sum(s.gpu_count for s in snapshots) * FULL
        self.allocated = 0
        gpu_mix = {t: w for t, w in task_mix(jobs).items() if t.gpus}
        self.frag = Fragmentation(gpu_mix) if gpu_mix else None
        self.cliques: dict[str, list[str]] = {}
        for s in snapshots:
            domain = s.fabric_domain()
            if domain is not None:
                self.cliques.setdefault(domain, []).append(s.name)
        self.gpus_of = {s.name: s.gpu_count for s in snapshots}

    def rate(self) -> float:
        return self.allocated / self.capacity if self.capacity else 0.0

    def fragmentation(self) -> float:
        if self.frag is None:
            return 0.0
        lost = free = 0.0
        for model, rooms, cpu, memory in self.policy.rooms():
            free += sum(rooms)
            lost += self.frag.of(model, rooms, cpu, memory)
        return lost / free if free else 0.0

    def stranded(self) -> tuple[int, int]:
        """(cliques, GPUs): multi-node cliques with free GPUs but no whole tray free."""
        if not self.cliques:
            return 0, 0
        rooms = dict(zip(self._names(), (r[1] for r in self.policy.rooms()), strict=True))
        cliques = gpus = 0
        for members in self.cliques.values():
            free = {m: sum(1 for r in rooms[m] if r == FULL) for m in members}
            if sum(free.values()) and not any(f == self.gpus_of[m] for m, f in free.items()):
                cliques += 1
                gpus += sum(free.values())
        return cliques, gpus

    def _names(self) -> list[str]:
        return sorted(self.gpus_of)


def simulate(
    policy: Policy,
    snapshots: Sequence[NodeSnapshot],
    jobs: Sequence[Job],
    mode: str,
    deadline: float,
    progress: Progress | None = None,
    cpu_capacity: int | None = None,
) -> SimResult:
    """``cpu_capacity``: the fleet's known milli-CPU, for the CPU allocation rate."""
    started = time.perf_counter()
    meter = _Meter(policy, snapshots, jobs)
    result = SimResult(policy=policy.name, mode=mode, total_gpus=meter.capacity // FULL)
    if mode == "fill":
        _fill(policy, jobs, meter, result, deadline, progress)
    elif mode == "timed":
        _timed(policy, jobs, meter, result, deadline, progress)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    result.end_rate = meter.rate()
    result.end_cpu_rate = cpu_rate(policy, snapshots, cpu_capacity)
    result.stranded_cliques, result.stranded_gpus = meter.stranded()
    result.seconds = time.perf_counter() - started
    return result


def cpu_rate(
    policy: Policy, snapshots: Sequence[NodeSnapshot], capacity: int | None
) -> float | None:
    if not capacity:
        return None
    free = sum(cpu for _, _, cpu, _ in policy.rooms() if cpu < UNLIMITED // 2)
    return 1.0 - free / capacity


def _record(result: SimResult, placed: Placed) -> None:
    result.started += 1
    if not placed.gpus:
        result.cpu_started += 1
    if len(placed.gpus) > 1:
        result.multi += 1
        result.multi_nvlink += int(placed.nvlink)
        result.multi_rings.append(placed.ring_gbps)


def _fail(result: SimResult, meter: _Meter, job: Job, at: float, cause: str) -> None:
    result.causes[cause] += 1
    if result.first_failure_at is None:
        result.first_failure_at = at
        result.failed_job = job
        result.unallocated_at_failure = (meter.capacity - meter.allocated) / FULL


def _fill(
    policy: Policy,
    jobs: Sequence[Job],
    meter: _Meter,
    result: SimResult,
    deadline: float,
    progress: Progress | None,
) -> None:
    every = max(1, len(jobs) // (SAMPLES // 4) or 1)
    position = 0
    total = len(jobs) * 2  # a guess for the progress bar: most fills end in the second pass
    for _ in range(MAX_PASSES):
        for job in jobs:
            if time.perf_counter() > deadline:
                result.truncated = True
                return
            placed, cause = policy.place(job)
            result.jobs += 1
            result.cpu_jobs += job.gpus == 0
            if placed is None:
                _fail(result, meter, job, position, cause)
            else:
                meter.allocated += job.gpus * job.milli
                _record(result, placed)
            position += 1
            if position % every == 0:
                result.timeline.append((position, meter.rate(), meter.fragmentation()))
                if progress:
                    progress(min(position, total - 1), total)
        if result.first_failure_at is not None or not jobs:
            break
    result.timeline.append((position, meter.rate(), meter.fragmentation()))
    if progress:
        progress(total, total)


def _timed(
    policy: Policy,
    jobs: Sequence[Job],
    meter: _Meter,
    result: SimResult,
    deadline: float,
    progress: Progress | None,
) -> None:
    # Events: (time, order, kind, payload); departures before arrivals at equal times.
    events: list[tuple[float, int, int, int]] = []
    for i, job in enumerate(jobs):
        heapq.heappush(events, (job.submit, 1, i, i))
    running: dict[int, Placed] = {}
    queue: deque[int] = deque()
    horizon = max((j.submit for j in jobs), default=0.0)
    step = horizon / SAMPLES if horizon > 0 else 1.0
    next_sample = 0.0
    sampled = 0  # at most SAMPLES + 1: a step that rounds to 0 must not sample forever
    arrived = 0
    counter = len(jobs)
    # Shapes that failed since the last release: nothing freed, so they fail again;
    # not asking spares the policy a full failure analysis per queued job.
    blocked: dict[tuple[int, int, tuple[str, ...], int, int], str] = {}

    def start(i: int, now: float) -> bool:
        nonlocal counter
        job = jobs[i]
        shape = job.shape
        if shape in blocked:
            _fail(result, meter, job, now, blocked[shape])
            return False
        placed, cause = policy.place(job)
        if placed is None:
            blocked[shape] = cause
            _fail(result, meter, job, now, cause)
            return False
        meter.allocated += job.gpus * job.milli
        _record(result, placed)
        result.delays.append(now - job.submit)
        running[i] = placed
        if job.duration is not None:
            counter += 1
            heapq.heappush(events, (now + job.duration, 0, counter, i))
        return True

    def retry(now: float) -> None:
        for _ in range(len(queue)):
            i = queue.popleft()
            job = jobs[i]
            if job.shape in blocked or not start(i, now):
                queue.append(i)

    while events:
        if time.perf_counter() > deadline:
            result.truncated = True
            break
        now, kind, _, i = heapq.heappop(events)
        while sampled <= SAMPLES and now >= next_sample and next_sample <= horizon:
            result.timeline.append((next_sample, meter.rate(), meter.fragmentation()))
            next_sample += step
            sampled += 1
        if kind == 0:
            blocked.clear()
            placed = running.pop(i)
            policy.release(placed)
            meter.allocated -= jobs[i].gpus * jobs[i].milli
            # every departure at this instant first, then one retry pass
            while events and events[0][0] == now and events[0][1] == 0:
                _, _, _, j = heapq.heappop(events)
                policy.release(running.pop(j))
                meter.allocated -= jobs[j].gpus * jobs[j].milli
            if queue:
                retry(now)
        else:
            arrived += 1
            result.jobs += 1
            result.cpu_jobs += jobs[i].gpus == 0
            if queue:
                # FIFO: it waits behind the queue; nothing was freed, so only
                # shapes not yet refused since the last release can start
                queue.append(i)
                retry(now)
            elif not start(i, now):
                queue.append(i)
            if progress and arrived % 256 == 0:
                progress(arrived, len(jobs))
    result.never_started = len(queue)
    result.timeline.append((now if events or jobs else 0.0, meter.rate(), meter.fragmentation()))
    if progress:
        progress(len(jobs), len(jobs))
