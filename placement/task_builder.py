"""Turning a chosen GPU set on a node into a TaskPlacement with its reason."""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from placement.islands import PCIE
from placement.node_choice import mask_to_indices
from placement.numa import choose_cpus
from placement.outcome import ScoreParts, TaskPlacement
from placement.request import PlacementRequest
from placement.table import NodeTable


class ScoreArrays(Protocol):
    """Per-node metric arrays, as both the full analysis and the hot-path cache keep them."""

    ring: NDArray[np.float64]
    pair: NDArray[np.float64]
    quality: NDArray[np.float64]
    fragmentation: NDArray[np.float64]
    numa_span: NDArray[np.int64]
    free_after: NDArray[np.int64]


def score_parts(arrays: ScoreArrays, index: int) -> ScoreParts:
    return ScoreParts(
        ring_gbps=float(arrays.ring[index]),
        pair_sum_gbps=float(arrays.pair[index]),
        bandwidth=round(float(arrays.quality[index]), 6),
        fragmentation=round(float(arrays.fragmentation[index]), 6),
        numa_nodes=int(arrays.numa_span[index]),
        free_after=int(arrays.free_after[index]),
    )


def build_task(
    table: NodeTable,
    slot: int,
    mask: int,
    request: PlacementRequest,
    task: int,
    parts: ScoreParts,
    extra_used_cpus: Collection[int] = (),
) -> TaskPlacement | None:
    """None when the CPUs the request asks for are not there (NUMA rule)."""
    entry = table.entry_at(slot)
    snap = entry.snapshot
    indices = mask_to_indices(mask)
    used = entry.used_cpus | set(extra_used_cpus) if extra_used_cpus else entry.used_cpus
    cpus = choose_cpus(snap, indices, request.cpus_per_task, used, request.numa)
    if cpus is None:
        return None
    island_names = tuple(dict.fromkeys(entry.island_of[i] for i in indices))
    connected = table.registry.set_metrics(entry.cid, mask)[2]
    return TaskPlacement(
        task=task,
        node=snap.name,
        gpu_indices=indices,
        gpu_uuids=tuple(snap.gpus[i].uuid for i in indices),
        mig_uuids=(),
        cpuset=cpus.cpuset,
        cpus=cpus.cpus,
        numa_nodes=cpus.numa_nodes,
        islands=island_names,
        nvlink_connected=connected,
        score=parts,
        reason=task_reason(snap.name, indices, island_names, connected, parts, cpus.numa_nodes),
        cpu_milli=request.cpu_milli or 0,
        memory_mib=request.memory_mib or 0,
    )


def task_reason(
    node: str,
    indices: tuple[int, ...],
    island_names: tuple[str, ...],
    connected: bool,
    parts: ScoreParts,
    numa_nodes: tuple[int, ...],
) -> str:
    gpus = ",".join(str(i) for i in indices)
    where = f"GPU {gpus} on {node}"
    if len(indices) == 1:
        group = island_names[0]
        link = f"PCIe group {group}" if group.startswith(PCIE) else f"island {group}"
    elif connected:
        link = f"NVLink-connected in {'+'.join(island_names)}, ring {parts.ring_gbps:g} GB/s"
    else:
        link = f"not NVLink-connected, ring {parts.ring_gbps:g} GB/s"
    quality = f"{parts.bandwidth:.0%} of the best this node design gives"
    numa = f"NUMA {','.join(str(n) for n in numa_nodes)}" if numa_nodes else "NUMA unknown"
    return f"{where}: {link} ({quality}); {numa}; {parts.free_after} GPUs left free"
