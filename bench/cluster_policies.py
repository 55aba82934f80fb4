"""Cluster-level baseline schedulers with GPU shares, for ``topoplace sim`` and bench/.

Each places one task (d whole GPUs, or a share of one GPU in thousandths)
on a cluster of nodes kept in name order, and releases it again. Per GPU
the state is its free thousandths ("room": 1000 = whole and free, 0 = held
whole or shared to the full); a whole-GPU task takes GPUs with room 1000
only, so whole-GPU jobs never share. The rules, each from its source:

- ``first-fit``: the first node in name order that fits; the lowest free
  GPUs there; a share goes to the lowest GPU with room (a device plugin
  handing out devices in enumeration order).
- ``best-fit``: FGD's multi-resource best-fit: the node left with the least
  free resources, a weighted sum of free GPUs and free CPU (the CPU counted
  in GPU-equivalents: the fleet's CPU per GPU), lowest index on ties; lowest
  free GPUs; a share to the GPU with the least room that fits (the classic
  bin-packing rule). Without CPU figures it is GPU best-fit.
- ``best-effort``: first feasible node in name order, then go-gpuallocator's
  best-effort partition policy (``bench.baselines.partition_best_effort``);
  go-gpuallocator has no shares: the lowest GPU with room.
- ``slurm-greedy``: Slurm's select/cons_tres with equal node weights: the
  first node in name order that fits; GPUs by its gres rules
  (``bench.baselines.slurm_greedy_gpus``: the socket with the most free GPUs
  first, then link bandwidth to the GPUs picked); shares as Slurm's
  ``shard`` GRES, from the lowest GPU with enough shards.
- ``fgd``: FGD's fragmentation gradient descent (``bench.fgd``): the node
  and GPUs whose choice increases the expected fragmentation least under
  the workload's task mix (CPU and memory included), lowest node on ties.

Every policy places only where GPUs, CPU and memory all fit (the host
check kube-scheduler's own filter makes). A node's host capacity is
optional (``hosts``: milli-CPU and MiB per node, None = not known, never
short); a task without GPUs takes CPU and memory only, on the node each
rule picks (first-fit and the first-node rules: the first that fits;
best-fit: the least left; fgd: the least fragmentation added).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench.baselines import partition_best_effort, slurm_greedy_gpus
from bench.fgd import FULL, UNLIMITED, Fragmentation, TaskType
from placement.bandwidth import DEFAULT_BANDWIDTH
from placement.snapshot import Health, NodeSnapshot
from placement.topology_class import Wiring, wiring_of

POLICIES = ("first-fit", "best-fit", "best-effort", "slurm-greedy", "fgd")


@dataclass(frozen=True, slots=True)
class Task:
    gpus: int
    milli: int  # per GPU: 1000 for whole GPUs, less for a share (gpus == 1)
    models: tuple[str, ...] = ()  # upper case; () = any
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class Held:
    node: int  # index in name order
    gpus: tuple[int, ...]
    milli: int
    cpu_milli: int = 0
    memory_mib: int = 0


HostCapacity = tuple[int | None, int | None]  # (milli-CPU, MiB); None: not known


class HostRooms:
    """Free CPU and memory per node (in name order); unknown capacity never runs short."""

    def __init__(self, capacities: Sequence[HostCapacity]) -> None:
        self.cpu_cap = np.asarray(
            [UNLIMITED if c is None else c for c, _ in capacities], dtype=np.int64
        )
        self.memory_cap = np.asarray(
            [UNLIMITED if m is None else m for _, m in capacities], dtype=np.int64
        )
        self.cpu = self.cpu_cap.copy()
        self.memory = self.memory_cap.copy()
        self.known_cpu = self.cpu_cap != UNLIMITED

    def fits(self, cpu_milli: int, memory_mib: int) -> NDArray[np.bool_]:
        if not cpu_milli and not memory_mib:
            return np.ones(self.cpu.shape, dtype=np.bool_)
        return np.asarray((self.cpu >= cpu_milli) & (self.memory >= memory_mib))

    def take(self, node: int, cpu_milli: int, memory_mib: int) -> None:
        self.cpu[node] -= cpu_milli
        self.memory[node] -= memory_mib

    def give(self, node: int, cpu_milli: int, memory_mib: int) -> None:
        self.cpu[node] += cpu_milli
        self.memory[node] += memory_mib

    def of(self, node: int) -> tuple[int, int]:
        return int(self.cpu[node]), int(self.memory[node])


class BaselineFleet:
    """GPU rooms and host rooms per node, nodes in name order, and one of the ``POLICIES``."""

    def __init__(
        self,
        snapshots: Sequence[NodeSnapshot],
        policy: str,
        task_mix: Mapping[TaskType, float] | None = None,
        hosts: Mapping[str, HostCapacity] | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy = policy
        snaps = sorted(snapshots, key=lambda s: s.name)
        self.names = [s.name for s in snaps]
        self.models = [s.gpus[0].model.upper() if s.gpus else "" for s in snaps]
        width = max((s.gpu_count for s in snaps), default=1)
        self.rooms = np.full((len(snaps), width), -1, dtype=np.int64)  # -1: no such GPU
        wirings: dict[str, Wiring] = {}
        self.wiring: list[Wiring] = []
        for i, snap in enumerate(snaps):
            for g in snap.gpus:
                usable = not g.mig_enabled and g.health is Health.HEALTHY
                self.rooms[i, g.index] = FULL if usable else 0
            wiring = wiring_of(snap, DEFAULT_BANDWIDTH)
            self.wiring.append(wirings.setdefault(wiring.key(), wiring))
        known = hosts or {}
        self.host = HostRooms([known.get(n, (None, None)) for n in self.names])
        self.whole = np.sum(self.rooms == FULL, axis=1)
        self.max_room = self.rooms.max(axis=1)
        self.total_room = np.sum(np.maximum(self.rooms, 0), axis=1)
        # best-fit weighs free CPU in GPU-equivalents: the fleet's known CPU per GPU
        cpu_known = self.host.known_cpu
        gpus_known = int(np.sum(self.rooms[cpu_known] >= 0))
        cpu_total = int(np.sum(self.host.cpu_cap[cpu_known]))
        self.cpu_per_gpu = cpu_total / gpus_known if gpus_known and cpu_total else 0.0
        self._model_ok: dict[tuple[str, ...], NDArray[np.bool_]] = {}
        self._fgd = Fragmentation(task_mix) if policy == "fgd" and task_mix else None
        if policy == "fgd" and self._fgd is None:
            raise ValueError("fgd needs the workload's task mix")
        # fgd: per task, every node's gradient, kept until the node changes
        self.version = np.zeros(len(snaps), dtype=np.int64)
        self._gradients: dict[Task, tuple[NDArray[np.int64], NDArray[np.float64]]] = {}

    # Queries ---------------------------------------------------------------

    def model_ok(self, models: tuple[str, ...]) -> NDArray[np.bool_]:
        ok = self._model_ok.get(models)
        if ok is None:
            ok = np.asarray([not models or any(m in x for m in models) for x in self.models])
            self._model_ok[models] = ok
        return ok

    def gpu_feasible(self, task: Task) -> NDArray[np.bool_]:
        """Nodes whose GPUs fit the task (CPU and memory not asked)."""
        if task.gpus == 0:
            return np.ones(len(self.names), dtype=np.bool_)
        fits = self.whole >= task.gpus if task.milli >= FULL else self.max_room >= task.milli
        return np.asarray(fits & self.model_ok(task.models), dtype=np.bool_)

    def feasible(self, task: Task) -> NDArray[np.bool_]:
        host = self.host.fits(task.cpu_milli, task.memory_mib)
        return np.asarray(self.gpu_feasible(task) & host, dtype=np.bool_)

    def room_of(self, node: int) -> list[int]:
        return [int(r) for r in self.rooms[node] if r >= 0]

    # Placement -------------------------------------------------------------

    def place(self, task: Task) -> Held | None:
        """Choose and hold; None when nothing fits."""
        fits = self.feasible(task)
        if not fits.any():
            return None
        if self.policy == "fgd":
            node = self._fgd_node(task, fits)
        elif self.policy == "best-fit":
            node = self._best_fit_node(task, fits)
        else:
            node = int(np.flatnonzero(fits)[0])
        gpus = self._gpus(node, task) if task.gpus else ()
        held = Held(node, gpus, task.milli, task.cpu_milli, task.memory_mib)
        self._change(node, gpus, -task.milli)
        self.host.take(node, task.cpu_milli, task.memory_mib)
        return held

    def release(self, held: Held) -> None:
        self.host.give(held.node, held.cpu_milli, held.memory_mib)
        self._change(held.node, held.gpus, held.milli)

    def _best_fit_node(self, task: Task, fits: NDArray[np.bool_]) -> int:
        """FGD's best-fit: the least free GPU plus free CPU (in GPU-equivalents) left."""
        gpu_left = (self.total_room - task.gpus * task.milli) / FULL
        if self.cpu_per_gpu:
            cpu_left = np.where(self.host.known_cpu, self.host.cpu - task.cpu_milli, 0)
            left = gpu_left + cpu_left / self.cpu_per_gpu
        else:
            left = gpu_left
        return int(np.argmin(np.where(fits, left, np.inf)))

    def _gpus(self, node: int, task: Task) -> tuple[int, ...]:
        rooms = self.rooms[node]
        if task.milli < FULL:
            fitting = [g for g, r in enumerate(rooms.tolist()) if r >= task.milli]
            if self._fgd is not None:
                return (min(fitting, key=lambda g: (self._gradient(node, g, task), g)),)
            if self.policy == "best-fit":
                return (min(fitting, key=lambda g: (int(rooms[g]), g)),)
            return (fitting[0],)
        free = [g for g, r in enumerate(rooms.tolist()) if r == FULL]
        if self.policy == "best-effort":
            got = partition_best_effort(self.wiring[node].bw, free, task.gpus)
        elif self.policy == "slurm-greedy":
            wiring = self.wiring[node]
            got = slurm_greedy_gpus(free, task.gpus, wiring.sockets, wiring.bw)
        else:
            got = tuple(free[: task.gpus])
        assert got is not None and len(got) == task.gpus
        return tuple(got)

    def _change(self, node: int, gpus: tuple[int, ...], delta: int) -> None:
        for g in gpus:
            self.rooms[node, g] += delta
        row = self.rooms[node]
        self.whole[node] = int(np.sum(row == FULL))
        self.max_room[node] = int(row.max())
        self.total_room[node] = int(np.sum(np.maximum(row, 0)))
        self.version[node] += 1

    # FGD -------------------------------------------------------------------

    def _gradient(self, node: int, gpu: int, task: Task) -> float:
        """FGD: the gain in expected fragmentation of putting a share on one GPU."""
        after = self.room_of(node)
        room = int(self.rooms[node, gpu])
        after.remove(room)
        after.append(room - task.milli)
        return self._gain(node, task, [tuple(sorted(after))])

    def _node_gradient(self, node: int, task: Task) -> float:
        """The least gain in expected fragmentation the task can make on one node."""
        return self._gain(node, task, _after(tuple(sorted(self.room_of(node))), task))

    def _gain(self, node: int, task: Task, afters: Sequence[tuple[int, ...]]) -> float:
        """The least gain in the node's expected fragmentation over the GPU states the
        task may leave (sorted rooms), its CPU and memory taken."""
        assert self._fgd is not None
        model = self.models[node]
        cpu, memory = self.host.of(node)
        before = self._fgd.of(model, tuple(sorted(self.room_of(node))), cpu, memory)
        cpu_after, memory_after = cpu - task.cpu_milli, memory - task.memory_mib
        return min(self._fgd.of(model, a, cpu_after, memory_after) for a in afters) - before

    def _fgd_node(self, task: Task, fits: NDArray[np.bool_]) -> int:
        """The feasible node whose state gains the least expected fragmentation."""
        masked = self.gradients(task, fits)
        best = masked.min()
        # ties within float noise go to the lowest node
        return int(np.flatnonzero(masked <= best + 1e-9)[0])

    def gradients(self, task: Task, fits: NDArray[np.bool_]) -> NDArray[np.float64]:
        """Per node, the least gain in expected fragmentation the task can make there
        (inf where it does not fit). Each node's gradient for this task is kept until
        the node changes (its version), so a decision recomputes only the nodes touched
        since the last task of the same type."""
        cached = self._gradients.get(task)
        if cached is None:
            versions = np.full(len(self.names), -1, dtype=np.int64)
            gradients = np.zeros(len(self.names), dtype=np.float64)
            self._gradients[task] = (versions, gradients)
        else:
            versions, gradients = cached
        stale = np.flatnonzero(fits & (versions != self.version))
        for node in stale.tolist():
            gradients[node] = self._node_gradient(node, task)
            versions[node] = self.version[node]
        return np.asarray(np.where(fits, gradients, np.inf), dtype=np.float64)


def _after(rooms: tuple[int, ...], task: Task) -> list[tuple[int, ...]]:
    """Every distinct state the task can leave (sorted rooms)."""
    if task.gpus == 0:
        return [rooms]
    if task.milli >= FULL:
        out = list(rooms)
        for _ in range(task.gpus):
            out.remove(FULL)
            out.append(0)
        return [tuple(sorted(out))]
    states = []
    for value in sorted(set(rooms)):
        if value >= task.milli:
            out = list(rooms)
            out.remove(value)
            out.append(value - task.milli)
            states.append(tuple(sorted(out)))
    return states
