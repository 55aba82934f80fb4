"""Cluster-level baseline schedulers with GPU shares, for ``topoplace sim`` and bench/.

Each places one task (d whole GPUs, or a share of one GPU in thousandths)
on a cluster of nodes kept in name order, and releases it again. Per GPU
the state is its free thousandths ("room": 1000 = whole and free, 0 = held
whole or shared to the full); a whole-GPU task takes GPUs with room 1000
only, so whole-GPU jobs never share. The rules, each from its source:

- ``first-fit``: the first node in name order that fits; the lowest free
  GPUs there; a share goes to the lowest GPU with room (a device plugin
  handing out devices in enumeration order).
- ``best-fit``: best-fit packing: the node left with the least free GPU
  capacity, lowest index on ties; lowest free GPUs; a share to the GPU with
  the least room that fits (the classic bin-packing rule).
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
  the workload's task mix, lowest node on ties.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from bench.baselines import partition_best_effort, slurm_greedy_gpus
from bench.fgd import FULL, Fragmentation, TaskType
from placement.bandwidth import DEFAULT_BANDWIDTH
from placement.snapshot import Health, NodeSnapshot
from placement.topology_class import Wiring, wiring_of

POLICIES = ("first-fit", "best-fit", "best-effort", "slurm-greedy", "fgd")


@dataclass(frozen=True, slots=True)
class Task:
    gpus: int
    milli: int  # per GPU: 1000 for whole GPUs, less for a share (gpus == 1)
    models: tuple[str, ...] = ()  # upper case; () = any


@dataclass(frozen=True, slots=True)
class Held:
    node: int  # index in name order
    gpus: tuple[int, ...]
    milli: int


class BaselineFleet:
    """GPU rooms per node, nodes in name order, and one of the ``POLICIES``."""

    def __init__(
        self,
        snapshots: Sequence[NodeSnapshot],
        policy: str,
        task_mix: Mapping[TaskType, float] | None = None,
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
        self.whole = np.sum(self.rooms == FULL, axis=1)
        self.max_room = self.rooms.max(axis=1)
        self.total_room = np.sum(np.maximum(self.rooms, 0), axis=1)
        self._model_ok: dict[tuple[str, ...], NDArray[np.bool_]] = {}
        self._fgd = Fragmentation(task_mix) if policy == "fgd" and task_mix else None
        if policy == "fgd" and self._fgd is None:
            raise ValueError("fgd needs the workload's task mix")
        self._groups: dict[tuple[str, tuple[int, ...]], set[int]] = {}
        self._key: list[tuple[str, tuple[int, ...]]] = []
        if self._fgd is not None:
            for i in range(len(snaps)):
                key = self._state_key(i)
                self._key.append(key)
                self._groups.setdefault(key, set()).add(i)

    # Queries ---------------------------------------------------------------

    def model_ok(self, models: tuple[str, ...]) -> NDArray[np.bool_]:
        ok = self._model_ok.get(models)
        if ok is None:
            ok = np.asarray([not models or any(m in x for m in models) for x in self.models])
            self._model_ok[models] = ok
        return ok

    def feasible(self, task: Task) -> NDArray[np.bool_]:
        fits = self.whole >= task.gpus if task.milli >= FULL else self.max_room >= task.milli
        return np.asarray(fits & self.model_ok(task.models), dtype=np.bool_)

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
            left = np.where(fits, self.total_room - task.gpus * task.milli, np.iinfo(np.int64).max)
            node = int(np.argmin(left))
        else:
            node = int(np.flatnonzero(fits)[0])
        gpus = self._gpus(node, task)
        held = Held(node=node, gpus=gpus, milli=task.milli)
        self._change(node, gpus, -task.milli)
        return held

    def release(self, held: Held) -> None:
        self._change(held.node, held.gpus, held.milli)

    def _gpus(self, node: int, task: Task) -> tuple[int, ...]:
        rooms = self.rooms[node]
        if task.milli < FULL:
            fitting = [g for g, r in enumerate(rooms.tolist()) if r >= task.milli]
            if self._fgd is not None:
                return (min(fitting, key=lambda g: (self._gradient(node, g, task.milli), g)),)
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
        if self._fgd is not None:
            old = self._key[node]
            self._groups[old].discard(node)
            if not self._groups[old]:
                del self._groups[old]
            key = self._state_key(node)
            self._key[node] = key
            self._groups.setdefault(key, set()).add(node)

    # FGD -------------------------------------------------------------------

    def _state_key(self, node: int) -> tuple[str, tuple[int, ...]]:
        return self.models[node], tuple(sorted(self.room_of(node)))

    def _gradient(self, node: int, gpu: int, milli: int) -> float:
        """FGD: the gain in expected fragmentation of putting ``milli`` on one GPU."""
        assert self._fgd is not None
        model, rooms = self._key[node]
        after = list(rooms)
        after.remove(int(self.rooms[node, gpu]))
        after.append(int(self.rooms[node, gpu]) - milli)
        return self._fgd.of(model, tuple(sorted(after))) - self._fgd.of(model, rooms)

    def _fgd_node(self, task: Task, fits: NDArray[np.bool_]) -> int:
        """The feasible node whose state gains the least expected fragmentation."""
        assert self._fgd is not None
        best_delta, best_node = float("inf"), -1
        for (model, rooms), members in self._groups.items():
            any_member = next(iter(members))
            if not fits[any_member]:
                continue
            before = self._fgd.of(model, rooms)
            delta = min(self._fgd.of(model, after) - before for after in _after(rooms, task))
            node = min(members)
            if delta < best_delta - 1e-9 or (abs(delta - best_delta) <= 1e-9 and node < best_node):
                best_delta, best_node = delta, node
        return best_node


def _after(rooms: tuple[int, ...], task: Task) -> list[tuple[int, ...]]:
    """Every distinct state the task can leave (sorted rooms)."""
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
