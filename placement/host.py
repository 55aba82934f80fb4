"""Host CPU and memory: what a node has, what its tasks hold, and GPUs it strands.

A node's host capacity is milli-CPU and MiB, from its snapshot's NUMA nodes
(their CPUs x 1000, the sum of their ``memory_mib``) or set by the caller
(``ClusterState.set_host_capacity``: the sim sets it from the trace's node
list). A figure that is not known is unlimited. What the node's tasks hold
is counted from the placements applied with ``cpu_milli`` / ``memory_mib``
(``PlacementRequest``): only tasks that carry the figures count, so the
known use is a lower bound of the node's true use.

GPU capacity left free on a node whose free CPU or memory cannot serve it
is **stranded**: the requests of the mix cannot use it until the host frees
up. With the mix's CPU ``c`` and memory ``m`` per GPU (``HostMix``), a node
with free GPU capacity ``g`` (whole free GPUs plus the room on shared ones),
free CPU ``C`` and memory ``M`` serves ``min(g, C / c, M / m)`` of it; the
rest is stranded. The ranking counts what a choice strands
(``stranded_added``) in whole GPUs, before packing (docs/engine.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from placement.snapshot import NodeSnapshot

UNKNOWN = -1  # a capacity not known: never short
MILLI_PER_CPU = 1000


def snapshot_capacity(snapshot: NodeSnapshot) -> tuple[int, int]:
    """(milli-CPU, MiB) the snapshot reports, UNKNOWN where it reports none."""
    cpus = len({cpu for numa in snapshot.numa_nodes for cpu in numa.cpu_list})
    memory = sum(numa.memory_mib for numa in snapshot.numa_nodes)
    return (cpus * MILLI_PER_CPU if cpus else UNKNOWN, memory if memory else UNKNOWN)


class HostMix:
    """CPU and memory per GPU of the requests the cluster serves: configured, or observed.

    Observed: the sums over every task applied with host figures (whole GPUs,
    or the share's fraction), never decreased by a release: it is the mix of
    requests seen, as ``size_mix`` is the mix of sizes asked for.
    """

    def __init__(self, configured: tuple[float, float] | None = None) -> None:
        if configured is not None and (
            min(configured) < 0 or not all(map(np.isfinite, configured))
        ):
            raise ValueError(f"host_mix is (milli-CPU, MiB) per GPU, each >= 0, not {configured}")
        self.configured = configured
        self.gpus = 0.0
        self.cpu_milli = 0.0
        self.memory_mib = 0.0

    def observe(self, gpus: float, cpu_milli: int, memory_mib: int) -> None:
        self.gpus += gpus
        self.cpu_milli += cpu_milli
        self.memory_mib += memory_mib

    def per_gpu(self) -> tuple[float, float]:
        """(milli-CPU, MiB) per GPU; 0 for a figure not counted (nothing observed)."""
        if self.configured is not None:
            return self.configured
        if self.gpus <= 0:
            return 0.0, 0.0
        return self.cpu_milli / self.gpus, self.memory_mib / self.gpus


def usable(gpus: Any, free: Any, per_gpu: float) -> Any:
    """How many of ``gpus`` free GPUs one host resource (``free``, inf if not known) serves."""
    if per_gpu <= 0:
        return gpus
    return np.minimum(gpus, free / per_gpu)


def stranded_added(
    gpus: Any,
    k: float,
    cpu_free: Any,
    memory_free: Any,
    cpu: int,
    memory: int,
    per_gpu: tuple[float, float],
) -> Any:
    """GPUs a task of ``k`` GPUs, ``cpu`` and ``memory`` strands on nodes with ``gpus`` free
    whole GPUs and that host room (inf where not known); negative where it frees some."""
    c, m = per_gpu

    def stranded(g: Any, cf: Any, mf: Any) -> Any:
        return g - usable(usable(g, cf, c), mf, m)

    before = stranded(gpus, cpu_free, memory_free)
    after = stranded(gpus - k, cpu_free - cpu, memory_free - memory)
    # Counted in whole GPUs, the unit of the packing term it sits beside: a change of
    # less than half a GPU is within the spread of the mix's per-GPU averages, not a
    # GPU lost, and must not outweigh packing (docs/engine.md).
    return np.asarray(np.round(after - before), dtype=np.float64)


def free_room(cap: Any, used: Any) -> Any:
    """Free host room, inf where the capacity is not known."""
    return np.where(cap == UNKNOWN, np.inf, cap - used)
