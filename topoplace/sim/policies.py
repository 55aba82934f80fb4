"""The schedulers a simulation compares: the engine and the baselines of ``bench``.

Every policy answers ``place(job)`` with a ``Placed`` (and holds it) or None
with a cause, ``release(placed)``, and ``rooms()``: per node, the GPU model,
the free thousandths of each GPU (1000 = whole and free) and the free CPU
and memory, for the fragmentation figures. Every policy places only where
GPUs, CPU and memory all fit. Ring bandwidth and NVLink connectivity of
every multi-GPU set come from the same class tables for all policies, so
their figures compare.

The engine (``topoplace``) gets, as a scheduler's filter would hand it, the
nodes where the job's CPU and memory fit, narrowed by an expected-stranding
objective: among them, the nodes where the job adds the least expected
fragmentation, FGD's measure with CPU and memory (a node's free GPUs count
as stranded for every task type of the observed mix whose CPU or memory the
node can no longer hold, as well as for the GPU shapes it cannot serve),
within ``STRANDING_TOLERANCE`` GPUs of the least. The engine chooses the
node and the GPUs among those by its own ranking (packing, bandwidth, the
share rules); if it finds none there, it gets every node where CPU and
memory fit. A CPU-only job (the engine places GPUs only) goes to the node
where it adds the least expected fragmentation, then the least CPU left,
then name order. Without any host capacity the engine gets every node, as
before.
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
from placement.node_choice import indices_to_mask
from placement.outcome import Outcome, Placement
from placement.topology_class import EXACT_LIMIT, TopologyClass, build_class, wiring_of
from topoplace.sim.jobs import FULL, Job

ENGINE = "topoplace"
ALL_POLICIES = (ENGINE, *POLICIES)
# Nodes whose added expected fragmentation is within this many GPUs of the least count
# as equally good: the engine's own ranking (packing, bandwidth, shares) decides among
# them. 0.1 on the Alibaba v2023 trace (0.02-0.3 within 35 GPUs of it at the first
# failure; 0 or 0.005, which leave the engine little to choose, 250 GPUs worse).
STRANDING_TOLERANCE = 0.1

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
        size_mix: Mapping[int, float],
        tables: SetTables,
        mix: Mapping[TaskType, float] | None = None,
        hosts: Mapping[str, HostCapacity] | None = None,
    ) -> None:
        self.state = ClusterState(size_mix=size_mix)
        snaps = sorted(snapshots, key=lambda s: s.name)
        for snap in snaps:
            self.state.upsert(snap)
        self.tables = tables
        self.names = [s.name for s in snaps]
        self.index = {n: i for i, n in enumerate(self.names)}
        known = hosts or {}
        self.host = HostRooms([known.get(n, (None, None)) for n in self.names])
        hosted = any(c is not None or m is not None for c, m in known.values())
        demand = any(t.cpu_milli or t.memory_mib for t in (mix or {}))
        # the stranding objective: only where CPU or memory is counted on both sides
        self.limited = hosted and demand
        gpu_mix = {t: w for t, w in (mix or {}).items() if t.gpus} or {TaskType(1, FULL): 1.0}
        # FGD's measure over a mirror of the engine's holdings: the stranding objective
        self.shadow = BaselineFleet(snaps, "fgd", gpu_mix, hosts) if self.limited else None
        self._requests: dict[tuple[int, int, tuple[str, ...]], PlacementRequest] = {}

    def request(self, job: Job) -> PlacementRequest:
        key = (job.gpus, job.milli, job.models)
        request = self._requests.get(key)
        if request is None:
            fraction = job.milli / FULL if job.milli < FULL else None
            request = PlacementRequest(gpus=job.gpus, gpu_models=job.models, gpu_fraction=fraction)
            self._requests[key] = request
        return request

    def _tiers(self, job: Job) -> tuple[NDArray[np.bool_], NDArray[np.float64] | None]:
        fits = self.host.fits(job.cpu_milli, job.memory_mib)
        if self.shadow is None:
            return fits, None
        # the shadow mirrors the engine's holdings: FGD's gradient per node, in GPUs
        task = Task(job.gpus, job.milli, job.models, job.cpu_milli, job.memory_mib)
        return fits, self.shadow.gradients(task, self.shadow.feasible(task)) / FULL

    def place(self, job: Job) -> tuple[Placed | None, str]:
        fits, added = self._tiers(job)
        if job.gpus == 0:
            if not fits.any():
                return None, HOST_SHORT
            return self._place_host_only(job, fits, added), ""
        request = self.request(job)
        if not fits.any():
            # as the baselines say it: the GPUs' cause when they fit nowhere either
            anywhere = self.state.place(request)
            return None, HOST_SHORT if anywhere.placement is not None else _cause(anywhere)
        everywhere = request if fits.all() else self._among(request, np.flatnonzero(fits))
        outcome = None
        if added is not None:
            masked = np.where(fits, added, np.inf)
            best = np.flatnonzero(masked <= masked.min() + STRANDING_TOLERANCE)
            if best.size < int(fits.sum()):
                outcome = self.state.place(self._among(request, best))
                if outcome.placement is not None and job.gpus > 1:
                    # bandwidth before stranding: the engine's first keys are not given up
                    wide = self.state.place(everywhere)
                    if _bandwidth(wide) > _bandwidth(outcome):
                        outcome = wide
        if outcome is None or outcome.placement is None:
            outcome = self.state.place(everywhere)
        assert outcome is not None
        if outcome.placement is None:
            cause = _cause(outcome)
            gpu_only = Task(job.gpus, job.milli, job.models)
            if (
                self.shadow is not None
                and not fits.all()
                and self.shadow.gpu_feasible(gpu_only).any()
            ):
                # the GPUs fit somewhere, but not where CPU and memory do
                cause = HOST_SHORT
            return None, cause
        self.state.apply(outcome.placement)
        task = outcome.placement.tasks[0]
        node = self.index[task.node]
        self.host.take(node, job.cpu_milli, job.memory_mib)
        shadow = self._mirror(node, task.gpu_indices, job)
        ring, nvlink = self.tables.metrics(task.node, task.gpu_indices)
        handle = (outcome.placement, job.cpu_milli, job.memory_mib, shadow)
        return Placed(task.node, task.gpu_indices, job.milli, ring, nvlink, handle), ""

    def _among(self, request: PlacementRequest, nodes: NDArray[np.int64]) -> PlacementRequest:
        # model_copy: the names are the state's own, no need to validate them again
        return request.model_copy(update={"nodes": tuple(self.names[i] for i in nodes.tolist())})

    def _place_host_only(
        self, job: Job, fits: NDArray[np.bool_], added: NDArray[np.float64] | None
    ) -> Placed:
        cpu_left = np.where(fits, self.host.cpu - job.cpu_milli, np.iinfo(np.int64).max)
        if added is None:
            node = int(np.argmin(cpu_left))
        else:
            masked = np.where(fits, added, np.inf)
            tied = np.flatnonzero(masked <= masked.min() + 1e-9)
            node = int(tied[np.argmin(cpu_left[tied])])
        self.host.take(node, job.cpu_milli, job.memory_mib)
        handle = (None, job.cpu_milli, job.memory_mib, self._mirror(node, (), job))
        return Placed(self.names[node], (), job.milli, 0.0, False, handle)

    def _mirror(self, node: int, gpus: tuple[int, ...], job: Job) -> Held | None:
        if self.shadow is None:
            return None
        task = Task(job.gpus, job.milli, job.models, job.cpu_milli, job.memory_mib)
        return self.shadow.hold(node, gpus, task)

    def release(self, placed: Placed) -> None:
        assert isinstance(placed.handle, tuple)
        placement, cpu, memory, shadow = placed.handle
        node = self.index[placed.node]
        if self.shadow is not None and isinstance(shadow, Held):
            self.shadow.release(shadow)
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


def _bandwidth(outcome: Outcome) -> tuple[bool, float]:
    """The engine's first ranking keys of a placed outcome: NVLink-connected, quality."""
    assert outcome.placement is not None
    task = outcome.placement.tasks[0]
    return task.nvlink_connected, task.score.bandwidth


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


def build_policies(
    names: Sequence[str],
    snapshots: Sequence[NodeSnapshot],
    jobs: Sequence[Job],
    hosts: Mapping[str, HostCapacity] | None = None,
) -> list[Policy]:
    """``hosts``: node name -> (milli-CPU, MiB), None where not known (never short)."""
    tables = SetTables(snapshots)
    sizes: dict[int, float] = {}
    for job in jobs:
        if job.gpus:
            sizes[job.gpus] = sizes.get(job.gpus, 0.0) + 1.0
    mix = task_mix(jobs)
    gpu_mix = {t: w for t, w in mix.items() if t.gpus} or {TaskType(1, FULL): 1.0}
    out: list[Policy] = []
    for name in names:
        if name == ENGINE:
            out.append(EnginePolicy(snapshots, sizes or {1: 1.0}, tables, mix, hosts))
        else:
            out.append(BaselinePolicy(snapshots, name, gpu_mix, tables, hosts))
    return out
