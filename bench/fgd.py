"""FGD's fragmentation measure (Weng et al., "Beware of Fragmentation", USENIX ATC '23).

A node's GPUs are described by their free thousandths (1000 = a whole free
GPU, 0 = full or held whole), and its host by its free CPU (milli-CPU) and
memory (MiB). For one task type m (d GPUs of ``milli`` thousandths each,
``cpu_milli`` and ``memory_mib`` of host, allowed on some GPU models) the
node's fragmentation F_n(m) is the free GPU capacity that m cannot use:

- all of it, when m cannot be placed on the node at all: too few GPUs with
  room, a model m does not accept, or too little free CPU or memory for m
  (the paper's case: GPUs on a node whose CPU is spent are stranded);
- else, for a share (milli < 1000): the GPUs whose room is below ``milli``;
- else, for whole GPUs: the GPUs partly used (room below 1000).

The node's expected fragmentation is F_n = sum_m p_m F_n(m) over the task
mix p (the workload's distribution of GPU task types; tasks without GPUs
need no GPU, so no GPU is fragmented for them, and they are left out of the
mix). FGD places a task where it increases the expected fragmentation least
(the fragmentation gradient). A host without CPU or memory figures
(``UNLIMITED``) never strands on that dimension.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FULL = 1000
UNLIMITED = 1 << 60  # free CPU or memory of a host whose capacity is not known


@dataclass(frozen=True, slots=True)
class TaskType:
    gpus: int
    milli: int  # per GPU; < 1000 for a share (then gpus == 1)
    models: tuple[str, ...] = ()  # accepted models, upper case substrings; () = any
    cpu_milli: int = 0
    memory_mib: int = 0

    def accepts(self, model: str) -> bool:
        return not self.models or any(m in model for m in self.models)

    def host_fits(self, cpu_free: int, memory_free: int) -> bool:
        return self.cpu_milli <= cpu_free and self.memory_mib <= memory_free


def task_fragmentation(
    rooms: Sequence[int],
    task: TaskType,
    model_ok: bool,
    cpu_free: int = UNLIMITED,
    memory_free: int = UNLIMITED,
) -> int:
    """F_n(m) in thousandths of a GPU for one node and one task type."""
    free = sum(rooms)
    if not model_ok or not task.host_fits(cpu_free, memory_free):
        return free
    if task.milli < FULL:
        if not any(r >= task.milli for r in rooms):
            return free
        return sum(r for r in rooms if r < task.milli)
    if sum(1 for r in rooms if r == FULL) < task.gpus:
        return free
    return sum(r for r in rooms if r < FULL)


class Fragmentation:
    """Expected fragmentation of node states under one task mix, memoised per state.

    Free CPU and memory enter the memo as the number of the mix's CPU and
    memory demands they cover (what decides which task types fit), so nodes
    with different but equivalent free CPU share an entry.
    """

    def __init__(self, mix: Mapping[TaskType, float]) -> None:
        gpu_mix = {t: w for t, w in mix.items() if t.gpus > 0 and w > 0}
        total = sum(gpu_mix.values())
        if total <= 0:
            raise ValueError("the task mix needs a positive weight on a GPU task")
        self.mix = [(t, w / total) for t, w in gpu_mix.items()]
        self.cpu_levels = sorted({t.cpu_milli for t, _ in self.mix})
        self.memory_levels = sorted({t.memory_mib for t, _ in self.mix})
        self._memo: dict[tuple[str, tuple[int, ...], int, int], float] = {}

    def _host_key(self, cpu_free: int, memory_free: int) -> tuple[int, int]:
        return bisect_right(self.cpu_levels, cpu_free), bisect_right(
            self.memory_levels, memory_free
        )

    def of(
        self,
        model: str,
        rooms: tuple[int, ...],
        cpu_free: int = UNLIMITED,
        memory_free: int = UNLIMITED,
    ) -> float:
        """F_n for a node of ``model`` whose GPUs have ``rooms`` (sorted, any order works)
        and whose host has ``cpu_free`` milli-CPU and ``memory_free`` MiB free."""
        ci, mi = self._host_key(cpu_free, memory_free)
        key = (model, rooms, ci, mi)
        value = self._memo.get(key)
        if value is None:
            # the lowest free amounts that cover the same demands: same answer
            cpu = self.cpu_levels[ci - 1] if ci else -1
            memory = self.memory_levels[mi - 1] if mi else -1
            value = sum(
                w * task_fragmentation(rooms, t, t.accepts(model), cpu, memory) for t, w in self.mix
            )
            self._memo[key] = value
        return value
