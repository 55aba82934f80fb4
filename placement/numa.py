"""CPUs for a task, taken from the NUMA node(s) of its GPUs."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from placement.cpuset import format_cpuset
from placement.request import NumaMode
from placement.snapshot import NodeSnapshot


@dataclass(frozen=True, slots=True)
class CpuChoice:
    cpus: tuple[int, ...]  # reserved CPUs (empty when none were asked for)
    cpuset: str  # what the task should be pinned to
    numa_nodes: tuple[int, ...]


def gpu_numa_nodes(snapshot: NodeSnapshot, gpu_indices: Sequence[int]) -> tuple[int, ...]:
    """NUMA nodes of the GPUs, the one holding most of them first."""
    # A plain dict: a Counter costs several times more for the one to eight GPUs of a
    # task, and every placement asks.
    gpus = snapshot.gpus
    counts: dict[int, int] = {}
    for i in gpu_indices:
        numa = gpus[i].numa_node
        if numa is not None:
            counts[numa] = counts.get(numa, 0) + 1
    if len(counts) == 1:
        return tuple(counts)
    return tuple(sorted(counts, key=lambda numa: (-counts[numa], numa)))


def gpus_beside_free_cpus(
    snapshot: NodeSnapshot, cpus_needed: int, used_cpus: Collection[int]
) -> int:
    """Mask of the GPUs whose own NUMA node has ``cpus_needed`` CPUs free.

    Under ``numa="required"`` a task's GPUs share one NUMA node and its CPUs come
    from that node alone, so a GPU outside this mask is in no set that can get
    its CPUs. A GPU of unknown NUMA node is outside it (no CPUs can be chosen)."""
    free: dict[int, int] = {}
    mask = 0
    for i, gpu in enumerate(snapshot.gpus):
        numa = gpu.numa_node
        if numa is None:
            continue
        if numa not in free:
            free[numa] = sum(1 for c in snapshot.numa_cpus(numa) if c not in used_cpus)
        if free[numa] >= cpus_needed:
            mask |= 1 << i
    return mask


def choose_cpus(
    snapshot: NodeSnapshot,
    gpu_indices: Sequence[int],
    cpus_needed: int,
    used_cpus: Collection[int],
    numa: NumaMode,
) -> CpuChoice | None:
    """Pick CPUs near the GPUs; None when the request's NUMA rule cannot be met.

    With no CPUs asked for, the task is pinned to its GPUs' NUMA nodes and
    nothing is reserved (the node's own scheduler accounts CPUs). Otherwise
    the lowest free CPU numbers of those NUMA nodes are reserved: Linux
    numbers one thread of every core before the SMT siblings, so low numbers
    spread over physical cores. ``numa="required"`` never spills to another
    NUMA node; the other modes do, nearest GPUs' NUMA nodes first.
    """
    local = gpu_numa_nodes(snapshot, gpu_indices)
    if cpus_needed == 0:
        return CpuChoice((), snapshot.numa_cpuset(local), local)
    if not snapshot.numa_nodes:
        return None
    used = set(used_cpus)
    order = list(local)
    if numa != "required":
        order += [n.id for n in snapshot.numa_nodes if n.id not in local]
    picked: list[int] = []
    touched: list[int] = []
    for numa_id in order:
        free = [c for c in snapshot.numa_cpus(numa_id) if c not in used]
        take = free[: cpus_needed - len(picked)]
        if take:
            picked += take
            touched.append(numa_id)
        if len(picked) == cpus_needed:
            return CpuChoice(tuple(sorted(picked)), format_cpuset(picked), tuple(touched))
    return None
