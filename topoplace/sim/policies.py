"""The schedulers a simulation compares: the engine and the baselines of ``bench``.

Every policy answers ``place(job)`` with a ``Placed`` (and holds it) or None
with a cause, ``release(placed)``, and ``rooms()``: per node, the free
thousandths of each GPU (1000 = whole and free), for the fragmentation
figures. Ring bandwidth and NVLink connectivity of every multi-GPU set come
from the same class tables for all policies, so their figures compare.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from bench.cluster_policies import POLICIES, BaselineFleet, Held, Task
from bench.fgd import TaskType
from placement import ClusterState, NodeSnapshot, PlacementRequest
from placement.bandwidth import DEFAULT_BANDWIDTH
from placement.node_choice import indices_to_mask
from placement.outcome import Placement
from placement.topology_class import EXACT_LIMIT, TopologyClass, build_class, wiring_of
from topoplace.sim.jobs import FULL, Job

ENGINE = "topoplace"
ALL_POLICIES = (ENGINE, *POLICIES)


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

    def rooms(self) -> Iterator[tuple[str, tuple[int, ...]]]: ...


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
    """The real engine: ``ClusterState.place`` then ``apply``, defaults as the service's."""

    name = ENGINE

    def __init__(
        self, snapshots: Sequence[NodeSnapshot], size_mix: Mapping[int, float], tables: SetTables
    ) -> None:
        self.state = ClusterState(size_mix=size_mix)
        for snap in sorted(snapshots, key=lambda s: s.name):
            self.state.upsert(snap)
        self.tables = tables
        self._requests: dict[tuple[int, int, tuple[str, ...]], PlacementRequest] = {}

    def request(self, job: Job) -> PlacementRequest:
        key = (job.gpus, job.milli, job.models)
        request = self._requests.get(key)
        if request is None:
            fraction = job.milli / FULL if job.milli < FULL else None
            request = PlacementRequest(gpus=job.gpus, gpu_models=job.models, gpu_fraction=fraction)
            self._requests[key] = request
        return request

    def place(self, job: Job) -> tuple[Placed | None, str]:
        outcome = self.state.place(self.request(job))
        if outcome.placement is None:
            cause = outcome.reasons[0].message if outcome.reasons else outcome.status
            return None, cause
        self.state.apply(outcome.placement)
        task = outcome.placement.tasks[0]
        ring, nvlink = self.tables.metrics(task.node, task.gpu_indices)
        placed = Placed(task.node, task.gpu_indices, job.milli, ring, nvlink, outcome.placement)
        return placed, ""

    def release(self, placed: Placed) -> None:
        assert isinstance(placed.handle, Placement)
        self.state.unapply(placed.handle)

    def rooms(self) -> Iterator[tuple[str, tuple[int, ...]]]:
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
            yield model, tuple(sorted(rooms))


class BaselinePolicy:
    def __init__(
        self,
        snapshots: Sequence[NodeSnapshot],
        name: str,
        task_mix: Mapping[TaskType, float],
        tables: SetTables,
    ) -> None:
        self.name = name
        self.fleet = BaselineFleet(snapshots, name, task_mix)
        self.tables = tables

    def place(self, job: Job) -> tuple[Placed | None, str]:
        held = self.fleet.place(Task(job.gpus, job.milli, job.models))
        if held is None:
            return None, _baseline_cause(self.fleet, job)
        node = self.fleet.names[held.node]
        ring, nvlink = self.tables.metrics(node, held.gpus)
        return Placed(node, held.gpus, job.milli, ring, nvlink, held), ""

    def release(self, placed: Placed) -> None:
        assert isinstance(placed.handle, Held)
        self.fleet.release(placed.handle)

    def rooms(self) -> Iterator[tuple[str, tuple[int, ...]]]:
        for i, model in enumerate(self.fleet.models):
            yield model, tuple(sorted(self.fleet.room_of(i)))


def _baseline_cause(fleet: BaselineFleet, job: Job) -> str:
    if not fleet.model_ok(job.models).any():
        return "no node has the GPU model"
    if job.milli < FULL:
        return "no GPU with room for the share"
    return f"fewer than {job.gpus} GPUs free"


def task_mix(jobs: Sequence[Job]) -> dict[TaskType, float]:
    mix: dict[TaskType, float] = {}
    for job in jobs:
        t = TaskType(job.gpus, job.milli, job.models)
        mix[t] = mix.get(t, 0.0) + 1.0
    return mix


def build_policies(
    names: Sequence[str], snapshots: Sequence[NodeSnapshot], jobs: Sequence[Job]
) -> list[Policy]:
    tables = SetTables(snapshots)
    sizes: dict[int, float] = {}
    for job in jobs:
        sizes[job.gpus] = sizes.get(job.gpus, 0.0) + 1.0
    mix = task_mix(jobs)
    out: list[Policy] = []
    for name in names:
        if name == ENGINE:
            out.append(EnginePolicy(snapshots, sizes or {1: 1.0}, tables))
        else:
            out.append(BaselinePolicy(snapshots, name, mix, tables))
    return out
