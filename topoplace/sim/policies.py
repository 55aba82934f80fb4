"""The schedulers a simulation compares: the engine and the baselines of ``bench``.

Every policy answers ``place(job)`` with a ``Placed`` (and holds it) or None
with a cause, ``release(placed)``, and ``rooms()``: per node, the GPU model,
the free thousandths of each GPU (1000 = whole and free) and the free CPU
and memory, for the fragmentation figures. Every policy places only where
GPUs, CPU and memory all fit. Ring bandwidth and NVLink connectivity of
every multi-GPU set come from the same class tables for all policies, so
their figures compare.

The engine (``topoplace``) gets, as kube-scheduler's own filter hands the
extender its candidates, the nodes where the job's CPU and memory fit, and
chooses the node and the GPUs among them as the service does (packing,
bandwidth, what is left, its share rules). Each request carries the job's
``cpu_milli`` and ``memory_mib`` and the engine's state knows every node's
host capacity (``ClusterState.set_host_capacity``) and the trace's CPU and
memory per GPU (``host_mix``, as ``size_mix`` is the trace's sizes): it
counts host use itself and prefers the choice that strands the fewest GPUs
for want of host CPU or memory, as a caller of the service that sends the
pods' requests gets. A CPU-only job (no GPU to place) goes where
kube-scheduler's default scoring puts it (``_place_host_only``). Without
any host capacity the engine gets every node, as before.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from bench.cluster_policies import POLICIES, BaselineFleet, Held, HostCapacity, HostRooms, Task
from bench.fgd import TaskType
from placement import ClusterState, NodeSnapshot, PlacementRequest
from placement.bandwidth import DEFAULT_BANDWIDTH
from placement.model_demand import MAX_LISTS, model_list
from placement.node_choice import indices_to_mask
from placement.outcome import Cause, Outcome, Placement
from placement.task_mix import MAX_TYPES
from placement.task_mix import TaskType as EngineType
from placement.topology_class import EXACT_LIMIT, TopologyClass, build_class, wiring_of
from placement.workload_mix import WorkloadMix
from topoplace.sim.jobs import FULL, Job

ENGINE = "topoplace"
ALL_POLICIES = (ENGINE, *POLICIES)
HOST_SHORT = "no node with the CPU and memory free"  # the GPUs would fit, CPU or memory not
Room = tuple[str, tuple[int, ...], int, int]  # model, sorted GPU rooms, free CPU, free memory


@dataclass(frozen=True, slots=True)
class Placed:
    node: str
    gpus: tuple[int, ...]
    milli: int
    ring_gbps: float
    nvlink: bool
    handle: object  # what the policy needs to release it


class Policy(Protocol):
    name: str

    def place(self, job: Job) -> tuple[Placed | None, str]: ...

    def release(self, placed: Placed) -> None: ...

    def rooms(self) -> Iterator[Room]: ...


class SetTables:
    """Ring and NVLink flag of any GPU set, from each design's class tables."""

    def __init__(self, snapshots: Sequence[NodeSnapshot]) -> None:
        classes: dict[str, TopologyClass | None] = {}
        self._of: dict[str, TopologyClass | None] = {}
        for snap in snapshots:
            wiring = wiring_of(snap, DEFAULT_BANDWIDTH)
            key = wiring.key()
            if key not in classes:
                classes[key] = build_class(wiring) if wiring.n <= EXACT_LIMIT else None
            self._of[snap.name] = classes[key]

    def metrics(self, node: str, gpus: tuple[int, ...]) -> tuple[float, bool]:
        tc = self._of[node]
        if tc is None or len(gpus) < 2:
            return 0.0, False
        mask = indices_to_mask(gpus)
        return float(tc.ring[mask]), bool(tc.nvlink_connected[mask])


class EnginePolicy:
    """The real engine: ``ClusterState.place`` then ``apply``, defaults as the service's,
    over the nodes where the job's CPU and memory fit (see the module's docstring)."""

    name = ENGINE

    def __init__(
        self,
        snapshots: Sequence[NodeSnapshot],
        mix: WorkloadMix,
        tables: SetTables,
        hosts: Mapping[str, HostCapacity] | None = None,
    ) -> None:
        self.state = ClusterState.from_mix(mix)
        snaps = sorted(snapshots, key=lambda s: s.name)
        known = hosts or {}
        for snap in snaps:
            self.state.upsert(snap)
            # The fleet's figures, as the other policies get them: None (not known) is
            # unlimited, whatever the snapshot says.
            cpu, memory = known.get(snap.name, (None, None))
            self.state.set_host_capacity(snap.name, cpu, memory)
        self.tables = tables
        self.names = [s.name for s in snaps]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.host = HostRooms([known.get(n, (None, None)) for n in self.names])
        self._requests: dict[tuple[int, int, tuple[str, ...], int, int], PlacementRequest] = {}

    def request(self, job: Job) -> PlacementRequest:
        key = (job.gpus, job.milli, job.models, job.cpu_milli, job.memory_mib)
        request = self._requests.get(key)
        if request is None:
            fraction = job.milli / FULL if job.milli < FULL else None
            # A job without CPU and memory asks for neither: sent as a GPU-only request.
            host = bool(job.cpu_milli or job.memory_mib)
            request = PlacementRequest(
                gpus=job.gpus,
                gpu_models=job.models,
                gpu_fraction=fraction,
                cpu_milli=job.cpu_milli if host else None,
                memory_mib=job.memory_mib if host else None,
            )
            self._requests[key] = request
        return request

    def place(self, job: Job) -> tuple[Placed | None, str]:
        fits = self.host.fits(job.cpu_milli, job.memory_mib)
        if job.gpus == 0:
            if not fits.any():
                return None, HOST_SHORT
            return self._place_host_only(job, fits), ""
        request = self.request(job)
        if fits.all():
            outcome: Outcome | None = self.state.place(request)
        elif fits.any():
            outcome = self.state.place(self._among(request, fits))
        else:
            outcome = None  # no node's CPU and memory fit: there is nothing to ask
        if outcome is None or outcome.placement is None:
            anywhere = outcome if fits.all() else self.state.place(request)
            assert anywhere is not None
            # the GPUs fit somewhere, but not where CPU and memory do; else the GPUs' cause
            host = any(r.cause is Cause.HOST for r in anywhere.reasons)
            return None, HOST_SHORT if host or anywhere.placement is not None else _cause(anywhere)
        self.state.apply(outcome.placement)
        task = outcome.placement.tasks[0]
        self.host.take(self.index[task.node], job.cpu_milli, job.memory_mib)
        ring, nvlink = self.tables.metrics(task.node, task.gpu_indices)
        handle = (outcome.placement, job.cpu_milli, job.memory_mib)
        return Placed(task.node, task.gpu_indices, job.milli, ring, nvlink, handle), ""

    def _among(self, request: PlacementRequest, fits: NDArray[np.bool_]) -> PlacementRequest:
        # model_copy: the names are the state's own, no need to validate them again
        nodes = tuple(self.names[i] for i in np.flatnonzero(fits).tolist())
        return request.model_copy(update={"nodes": nodes})

    def _place_host_only(self, job: Job, fits: NDArray[np.bool_]) -> Placed:
        # No GPU: the extender is not asked, and kube-scheduler's default scoring places
        # the pod (NodeResourcesFit, LeastAllocated): the node with the largest share of
        # its CPU and memory free after it, the first in name order on a tie.
        host = self.host
        cpu = (host.cpu - job.cpu_milli) / host.cpu_cap
        memory = (host.memory - job.memory_mib) / host.memory_cap
        node = int(np.argmax(np.where(fits, cpu + memory, -np.inf)))
        self.host.take(node, job.cpu_milli, job.memory_mib)
        handle = (None, job.cpu_milli, job.memory_mib)
        return Placed(self.names[node], (), job.milli, 0.0, False, handle)

    def release(self, placed: Placed) -> None:
        assert isinstance(placed.handle, tuple)
        placement, cpu, memory = placed.handle
        node = self.index[placed.node]
        if placement is not None:
            assert isinstance(placement, Placement)
            self.state.unapply(placement)
        self.host.give(node, cpu, memory)

    def rooms(self) -> Iterator[Room]:
        for name in self.state.names():
            entry = self.state.node(name)
            snap = entry.snapshot
            free = entry.free_mask
            by_index = entry.shares_by_index
            rooms = []
            for g in snap.gpus:
                if g.index in by_index:
                    rooms.append(FULL - by_index[g.index])
                else:
                    rooms.append(FULL if free >> g.index & 1 else 0)
            model = snap.gpus[0].model.upper() if snap.gpus else ""
            cpu, memory = self.host.of(self.index[name])
            yield model, tuple(sorted(rooms)), cpu, memory


class BaselinePolicy:
    def __init__(
        self,
        snapshots: Sequence[NodeSnapshot],
        name: str,
        task_mix: Mapping[TaskType, float],
        tables: SetTables,
        hosts: Mapping[str, HostCapacity] | None = None,
    ) -> None:
        self.name = name
        self.fleet = BaselineFleet(snapshots, name, task_mix, hosts)
        self.tables = tables

    def place(self, job: Job) -> tuple[Placed | None, str]:
        task = Task(job.gpus, job.milli, job.models, job.cpu_milli, job.memory_mib)
        held = self.fleet.place(task)
        if held is None:
            return None, _baseline_cause(self.fleet, task)
        node = self.fleet.names[held.node]
        ring, nvlink = self.tables.metrics(node, held.gpus)
        return Placed(node, held.gpus, job.milli, ring, nvlink, held), ""

    def release(self, placed: Placed) -> None:
        assert isinstance(placed.handle, Held)
        self.fleet.release(placed.handle)

    def rooms(self) -> Iterator[Room]:
        for i, model in enumerate(self.fleet.models):
            cpu, memory = self.fleet.host.of(i)
            yield model, tuple(sorted(self.fleet.room_of(i))), cpu, memory


def _cause(outcome: Outcome) -> str:
    return outcome.reasons[0].message if outcome.reasons else outcome.status


def _baseline_cause(fleet: BaselineFleet, task: Task) -> str:
    if task.gpus and not fleet.model_ok(task.models).any():
        return "no node has the GPU model"
    gpu = fleet.gpu_feasible(task)
    if gpu.any():
        return HOST_SHORT
    if task.milli < FULL:
        return "no GPU with room for the share"
    return f"fewer than {task.gpus} GPUs free"


def task_mix(jobs: Sequence[Job]) -> dict[TaskType, float]:
    """Every job's task type -> count (CPU-only ones too: ``bench.fgd`` leaves them out)."""
    mix: dict[TaskType, float] = {}
    for job in jobs:
        t = TaskType(job.gpus, job.milli, job.models, job.cpu_milli, job.memory_mib)
        mix[t] = mix.get(t, 0.0) + 1.0
    return mix


def engine_types(jobs: Sequence[Job]) -> dict[EngineType, float] | None:
    """The trace's GPU jobs with CPU or memory as the engine's task mix: (GPUs, thousandths
    per GPU, milli-CPU, MiB) -> count, as FGD gets the trace's task mix; None (observed)
    when no GPU job carries host figures."""
    mix: dict[EngineType, float] = {}
    for job in jobs:
        if job.gpus and (job.cpu_milli or job.memory_mib):
            t = (job.gpus, job.milli, job.cpu_milli, job.memory_mib)
            mix[t] = mix.get(t, 0.0) + 1.0
    # The engine keeps at most MAX_TYPES types, as it does observing: the most frequent
    # (the first seen among equals; sorted is stable).
    kept = sorted(mix, key=lambda t: -mix[t])[:MAX_TYPES]
    return {t: mix[t] for t in kept} or None


def model_demand(jobs: Sequence[Job]) -> dict[tuple[str, ...], float] | None:
    """The trace's GPUs asked per model list (() for any model), the engine's
    ``model_demand``, as FGD gets the trace's task mix with each type's models; None
    (observed) when no job names a model."""
    demand: dict[tuple[str, ...], float] = {}
    for job in jobs:
        if job.gpus:
            key = model_list(job.models)
            demand[key] = demand.get(key, 0.0) + job.gpu_demand
    if not any(models for models in demand):
        return None
    # At most MAX_LISTS model lists, as the engine keeps observing: the most asked. The
    # GPUs of the others stay in the total, as any-model demand.
    named = sorted((m for m in demand if m), key=lambda m: -demand[m])
    rest = sum(demand[m] for m in named[MAX_LISTS:]) + demand.get((), 0.0)
    kept = {m: demand[m] for m in named[:MAX_LISTS]}
    return {**kept, (): rest} if rest else kept


def per_gpu_host(jobs: Sequence[Job]) -> tuple[float, float] | None:
    """The trace's GPU jobs' milli-CPU and MiB per GPU (a share counts its fraction), the
    engine's ``host_mix``; None when no GPU job has GPUs to divide by."""
    gpus = cpu = memory = 0.0
    for job in jobs:
        if job.gpus:
            gpus += job.gpus if job.milli >= FULL else job.milli / FULL
            cpu += job.cpu_milli
            memory += job.memory_mib
    return (cpu / gpus, memory / gpus) if gpus else None


def trace_mix(jobs: Sequence[Job]) -> WorkloadMix:
    """The mix the engine is given for a replay of ``jobs``, as FGD gets the trace's:
    its sizes, CPU and memory per GPU, task types and model demand (the parts the trace
    has nothing for stay observed). ``topoplace sim --write-mix`` writes exactly this."""
    sizes: dict[int, float] = {}
    for job in jobs:
        if job.gpus:
            sizes[job.gpus] = sizes.get(job.gpus, 0.0) + 1.0
    return WorkloadMix(
        size_mix=sizes or {1: 1.0},
        host_mix=per_gpu_host(jobs),
        task_mix=engine_types(jobs),
        model_demand=model_demand(jobs),
    )


def build_policies(
    names: Sequence[str],
    snapshots: Sequence[NodeSnapshot],
    jobs: Sequence[Job],
    hosts: Mapping[str, HostCapacity] | None = None,
) -> list[Policy]:
    """``hosts``: node name -> (milli-CPU, MiB), None where not known (never short)."""
    tables = SetTables(snapshots)
    mix = task_mix(jobs)
    gpu_mix = {t: w for t, w in mix.items() if t.gpus} or {TaskType(1, FULL): 1.0}
    out: list[Policy] = []
    for name in names:
        if name == ENGINE:
            out.append(EnginePolicy(snapshots, trace_mix(jobs), tables, hosts))
        else:
            out.append(BaselinePolicy(snapshots, name, gpu_mix, tables, hosts))
    return out
