"""FGD's fragmentation measure (Weng et al., "Beware of Fragmentation", USENIX ATC '23).

A node's GPUs are described by their free thousandths (1000 = a whole free
GPU, 0 = full or held whole). For one task type m (d GPUs of ``milli``
thousandths each, allowed on some GPU models) the node's fragmentation
F_n(m) is the free GPU capacity that m cannot use:

- all of it, when m cannot be placed on the node at all (too few GPUs with
  room, or a model m does not accept);
- else, for a share (milli < 1000): the GPUs whose room is below ``milli``;
- else, for whole GPUs: the GPUs partly used (room below 1000).

The node's expected fragmentation is F_n = sum_m p_m F_n(m) over the task
mix p (the workload's distribution of task types). FGD places a task where
it increases the expected fragmentation least (the fragmentation
gradient); CPU and memory, which the paper also checks, are not modelled
here (topoplace places GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FULL = 1000


@dataclass(frozen=True, slots=True)
class TaskType:
    gpus: int
    milli: int  # per GPU; < 1000 for a share (then gpus == 1)
    models: tuple[str, ...] = ()  # accepted models, upper case substrings; () = any

    def accepts(self, model: str) -> bool:
        return not self.models or any(m in model for m in self.models)


def task_fragmentation(rooms: Sequence[int], task: TaskType, model_ok: bool) -> int:
    """F_n(m) in thousandths of a GPU for one node and one task type."""
    free = sum(rooms)
    if not model_ok:
        return free
    if task.milli < FULL:
        if not any(r >= task.milli for r in rooms):
            return free
        return sum(r for r in rooms if r < task.milli)
    if sum(1 for r in rooms if r == FULL) < task.gpus:
        return free
    return sum(r for r in rooms if r < FULL)


class Fragmentation:
    """Expected fragmentation of node states under one task mix, memoised per state."""

    def __init__(self, mix: Mapping[TaskType, float]) -> None:
        total = sum(mix.values())
        if total <= 0:
            raise ValueError("the task mix needs a positive weight")
        self.mix = [(t, w / total) for t, w in mix.items() if w > 0]
        self._memo: dict[tuple[str, tuple[int, ...]], float] = {}

    def of(self, model: str, rooms: tuple[int, ...]) -> float:
        """F_n for a node of ``model`` whose GPUs have ``rooms`` (sorted, any order works)."""
        key = (model, rooms)
        value = self._memo.get(key)
        if value is None:
            value = sum(w * task_fragmentation(rooms, t, t.accepts(model)) for t, w in self.mix)
            self._memo[key] = value
        return value
