"""The task mix, and FGD's expected fragmentation of a node's free capacity under it.

FGD (Weng et al., "Beware of Fragmentation", USENIX ATC '23) measures how
much of a node's free GPU capacity the tasks the cluster actually sees
cannot use. A task type is (GPUs, thousandths per GPU, milli-CPU, MiB): a
share of one GPU when the thousandths are below 1000, whole GPUs otherwise.
For one type t a node's free capacity G (whole free GPUs plus the room on
shared ones) is fragmented:

- all of it when t cannot be placed there: fewer whole free GPUs than t asks
  (a share: no GPU with its thousandths free), or less free CPU or memory
  than t's (the GPUs of a node whose host is spent are stranded for t);
- else, for whole GPUs, the room on shared GPUs (whole-GPU tasks cannot use
  it); for a share, the room on shared GPUs below its thousandths.

The node's expected fragmentation is F = sum over t of p_t F_t, with p the
mix's weights, in GPUs. What one choice costs is F after it less F before
(``expected_added``); the ranking reads it after the host term and before
packing (docs/engine.md). GPU models are not part of a type: which models a
request may use is the model pressure's business (``placement.model_demand``).

The mix is configured (``ClusterState(task_mix=...)``) or observed: every
task applied with host figures, never decreased by a release, as the host
mix is. At most ``MAX_TYPES`` types are kept, so callers choosing the
figures cannot grow the state: a new type replaces the least-weighted one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

FULL = 1000  # a GPU in thousandths, as the trace's gpu_milli
# Types kept at once: the Alibaba v2023 default list's GPU pods are 126. Callers choose the
# figures, and the prefix tables grow with the distinct CPU and memory figures kept.
MAX_TYPES = 256
# An observed mix's tables are built again at each of the first REFRESH observations, then
# at every REFRESH-th: one build takes about 1.3 ms for the trace's 126 types, three decisions.
REFRESH = 64

TaskType = tuple[int, int, int, int]  # GPUs, thousandths per GPU (1000: whole), milli-CPU, MiB


def task_type(gpus: float, cpu_milli: int, memory_mib: int) -> TaskType:
    """The type of a task of ``gpus`` GPUs (a fraction below 1: a share of one)."""
    if gpus < 1:
        return (1, max(1, min(FULL - 1, round(gpus * FULL))), cpu_milli, memory_mib)
    return (round(gpus), FULL, cpu_milli, memory_mib)


def _check(t: TaskType, weight: float) -> None:
    gpus, milli, cpu, memory = t
    share_ok = milli == FULL or (0 < milli < FULL and gpus == 1)
    if gpus < 1 or not share_ok or cpu < 0 or memory < 0:
        raise ValueError(
            f"a task type is (GPUs >= 1, thousandths 1..1000, 1 GPU for a share,"
            f" milli-CPU >= 0, MiB >= 0), not {t}"
        )
    if not (weight > 0 and np.isfinite(weight)):
        raise ValueError(f"a task type's weight is > 0, not {weight} for {t}")


@dataclass(frozen=True, slots=True)
class MixArrays:
    """The mix as prefix sums of its weights (which sum to 1), so that a node's figure is
    a few lookups instead of a pass over every type: ``whole[d, c, m]`` is the weight of the
    whole-GPU types that ask at most ``whole_sizes[d - 1]`` GPUs, ``cpu_levels[c - 1]``
    milli-CPU and ``memory_levels[m - 1]`` MiB (index 0: none); ``share[s, c, m]`` the same
    for the shares of ``sizes[s]`` thousandths."""

    whole_sizes: NDArray[np.int64]
    sizes: NDArray[np.int64]
    cpu_levels: NDArray[np.float64]
    memory_levels: NDArray[np.float64]
    whole: NDArray[np.float64]
    share: NDArray[np.float64]
    whole_weight: float
    share_weight: float


def _prefix(
    index: tuple[NDArray[np.int64], ...], weight: NDArray[np.float64], shape: tuple[int, ...]
) -> NDArray[np.float64]:
    table = np.zeros(shape)
    np.add.at(table, index, weight)
    for axis in range(1, len(shape)):
        table = np.cumsum(table, axis=axis)
    return table


def _arrays(weights: Mapping[TaskType, float]) -> MixArrays:
    types = list(weights)
    gpus = np.asarray([t[0] for t in types], dtype=np.int64)
    milli = np.asarray([t[1] for t in types], dtype=np.int64)
    cpu = np.asarray([t[2] for t in types], dtype=np.float64)
    memory = np.asarray([t[3] for t in types], dtype=np.float64)
    weight = np.asarray([weights[t] for t in types], dtype=np.float64)
    weight = weight / weight.sum()
    shares = milli < FULL
    whole_sizes = np.unique(gpus[~shares])
    sizes = np.unique(milli[shares])
    cpu_levels = np.unique(cpu)
    memory_levels = np.unique(memory)
    ci = np.searchsorted(cpu_levels, cpu) + 1
    mi = np.searchsorted(memory_levels, memory) + 1
    nc, nm = cpu_levels.size + 1, memory_levels.size + 1
    w = ~shares
    whole = _prefix(
        (np.searchsorted(whole_sizes, gpus[w]) + 1, ci[w], mi[w]),
        weight[w],
        (whole_sizes.size + 1, nc, nm),
    )
    whole = np.cumsum(whole, axis=0)  # at most d GPUs: every size up to d
    share = _prefix(
        (np.searchsorted(sizes, milli[shares]), ci[shares], mi[shares]),
        weight[shares],
        (sizes.size, nc, nm),
    )
    return MixArrays(
        whole_sizes=whole_sizes,
        sizes=sizes,
        cpu_levels=cpu_levels,
        memory_levels=memory_levels,
        whole=whole,
        share=share,
        whole_weight=float(weight[w].sum()),
        share_weight=float(weight[shares].sum()),
    )


class TaskMix:
    def __init__(self, configured: Mapping[TaskType, float] | None = None) -> None:
        self.configured = configured is not None
        self._weights: dict[TaskType, float] = {}
        if configured is not None:
            if len(configured) > MAX_TYPES:
                raise ValueError(f"a task mix has at most {MAX_TYPES} types")
            for t, w in configured.items():
                _check(t, w)
                self._weights[t] = float(w)
        self.version = 0  # bumps when the types or weights change
        self._arrays: MixArrays | None = None
        self._built_at = 0  # the version the arrays were built at

    def __len__(self) -> int:
        return len(self._weights)

    def observe(self, gpus: float, cpu_milli: int, memory_mib: int) -> None:
        if self.configured:
            return
        t = task_type(gpus, cpu_milli, memory_mib)
        if t not in self._weights and len(self._weights) >= MAX_TYPES:
            # The least-weighted type goes (the first seen among equals): types asked
            # often stay, and a stream of one-off types only replaces one-off types.
            del self._weights[min(self._weights, key=self._weights.__getitem__)]
        self._weights[t] = self._weights.get(t, 0.0) + 1.0
        self.version += 1

    def arrays(self) -> MixArrays | None:
        """The mix as columns; None while it has no type."""
        if not self._weights:
            return None
        # Built again at each of the first REFRESH observations, then at every REFRESH-th
        # (as the model pressure is): the weights settle, and an observed mix would
        # otherwise rebuild its tables at every decision.
        behind = self.version - self._built_at
        if self._arrays is None or (behind and (self.version <= REFRESH or behind >= REFRESH)):
            self._arrays = _arrays(self._weights)
            self._built_at = self.version
        return self._arrays


def room_stats(rooms: list[int], sizes: NDArray[np.int64]) -> tuple[NDArray[np.float64], int]:
    """For one node's shared GPUs' rooms (thousandths): per share size the room below it,
    and the largest room."""
    if not rooms:
        return np.zeros(sizes.size), 0
    r = np.asarray(rooms, dtype=np.float64)
    below: NDArray[np.float64] = (r[None, :] * (r[None, :] < sizes[:, None])).sum(axis=1)
    return below, int(r.max())


def expected(
    mix: MixArrays,
    whole: NDArray[np.int64],
    room: NDArray[np.float64],
    largest_room: NDArray[np.int64],
    below: NDArray[np.float64],
    cpu_free: NDArray[np.float64],
    memory_free: NDArray[np.float64],
) -> NDArray[np.float64]:
    """F per node, in GPUs. ``whole``: whole free GPUs; ``room``: thousandths free on
    shared GPUs; ``largest_room``: the largest of them; ``below``: per node and share size
    (``mix.sizes``) the room below it; host room inf where not known (negative: none)."""
    free = whole * float(FULL) + room
    c = np.searchsorted(mix.cpu_levels, cpu_free, side="right")
    m = np.searchsorted(mix.memory_levels, memory_free, side="right")
    d = np.searchsorted(mix.whole_sizes, whole, side="right")
    # Whole-GPU types that fit lose the room on shared GPUs; the others every free GPU.
    fits = mix.whole[d, c, m]
    lost = room * fits + free * (mix.whole_weight - fits)
    if mix.sizes.size:
        # Shares that fit lose the room below their size; the others every free GPU.
        gpu_ok = (whole[:, None] >= 1) | (largest_room[:, None] >= mix.sizes[None, :])
        share_fits = mix.share[:, c, m].T * gpu_ok
        lost += free * mix.share_weight - (share_fits * (free[:, None] - below)).sum(axis=1)
    out: NDArray[np.float64] = lost / FULL
    return out


def expected_added(
    mix: MixArrays,
    whole: NDArray[np.int64],
    k: int,
    room: NDArray[np.float64],
    largest_room: NDArray[np.int64],
    below: NDArray[np.float64],
    cpu_free: NDArray[np.float64],
    memory_free: NDArray[np.float64],
    cpu: int,
    memory: int,
    left: int = 0,
) -> NDArray[np.float64]:
    """F after a task of ``k`` whole GPUs, ``cpu`` and ``memory`` less F before, in GPUs;
    negative where the task leaves less of the node's capacity unusable. ``left``: the
    thousandths a share leaves free on the whole GPU it opens (0 for whole GPUs)."""
    before = expected(mix, whole, room, largest_room, below, cpu_free, memory_free)
    after = expected(
        mix,
        whole - k,
        room + left,
        np.maximum(largest_room, left),
        below + left * (left < mix.sizes) if left else below,
        cpu_free - cpu,
        memory_free - memory,
    )
    out: NDArray[np.float64] = after - before
    return out
