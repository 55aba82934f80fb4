"""The placement JSON of GPUs a scheduler chose by itself (Slurm ran a job on them).

The engine did not choose these GPUs, so there is no ranking to show; the task
carries what the node's snapshot says of them: their UUIDs, NUMA nodes,
NVLink islands and the best all-reduce ring through them.
"""

from __future__ import annotations

import itertools
from typing import Any

from placement import NodeSnapshot, bandwidth_matrix
from placement.islands import islands
from placement.snapshot import MigInstance

_BRUTE_FORCE_MAX = 8  # 7! ring orders; beyond it the index order stands in for the best


def ring_gbps(snapshot: NodeSnapshot, gpus: list[int]) -> float:
    """The best ring through these GPUs (the slowest link of the best cyclic order)."""
    if len(gpus) < 2:
        return 0.0
    bw = bandwidth_matrix(snapshot)
    first, rest = gpus[0], gpus[1:]
    orders = itertools.permutations(rest) if len(gpus) <= _BRUTE_FORCE_MAX else [tuple(rest)]
    best = 0.0
    for order in orders:
        cycle = [first, *order, first]
        best = max(best, min(float(bw[a][b]) for a, b in itertools.pairwise(cycle)))
    return best


def observed_placement(
    snapshots: dict[str, NodeSnapshot], gpus: dict[str, list[int]], reason: str
) -> dict[str, Any]:
    """Placement JSON (as service._placement_json writes it) for these GPUs per node."""
    tasks: list[dict[str, Any]] = []
    rings: list[float] = []
    for number, (node, indices) in enumerate(sorted(gpus.items())):
        snap = snapshots[node]
        chosen = sorted(indices)
        uuids = [snap.gpus[i].uuid for i in chosen]
        names = [i.name for i in islands(snap) if set(i.gpus) & set(chosen)]
        ring = ring_gbps(snap, chosen)
        rings.append(ring)
        visible = ",".join(uuids)
        tasks.append(
            {
                "task": number,
                "node": node,
                "gpu_indices": chosen,
                "gpu_uuids": uuids,
                "mig_uuids": [],
                "cpuset": "",
                "cpus": [],
                "numa_nodes": sorted(
                    {n for i in chosen if (n := snap.gpus[i].numa_node) is not None}
                ),
                "islands": names,
                "nvlink_connected": len(names) == 1 and len(chosen) > 1,
                "score": {
                    "ring_gbps": ring,
                    "pair_sum_gbps": 0.0,
                    "bandwidth": 0.0,
                    "fragmentation": 0.0,
                    "numa_nodes": 0,
                    "free_after": 0,
                },
                "reason": reason,
                "env": {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible},
            }
        )
    return {
        "tasks": tasks,
        "ring_gbps": min(rings, default=0.0),
        "fabric_domain": None,
        "network_blocks": [],
        "reason": reason,
    }


def observed_mig_placement(
    snapshot: NodeSnapshot, instances: list[MigInstance], reason: str
) -> dict[str, Any]:
    """Placement JSON for MIG instances a scheduler chose: one task per instance, as
    the engine places MIG (placement/mig.py), on the instance's parent GPU."""
    tasks: list[dict[str, Any]] = []
    for number, inst in enumerate(instances):
        gpu = snapshot.gpus[inst.parent_gpu]
        names = [i.name for i in islands(snapshot) if gpu.index in i.gpus]
        tasks.append(
            {
                "task": number,
                "node": snapshot.name,
                "gpu_indices": [gpu.index],
                "gpu_uuids": [gpu.uuid],
                "mig_uuids": [inst.uuid],
                "cpuset": "",
                "cpus": [],
                "numa_nodes": [gpu.numa_node] if gpu.numa_node is not None else [],
                "islands": names,
                "nvlink_connected": True,
                "score": {
                    "ring_gbps": 0.0,
                    "pair_sum_gbps": 0.0,
                    "bandwidth": 0.0,
                    "fragmentation": 0.0,
                    "numa_nodes": 0,
                    "free_after": 0,
                },
                "reason": reason,
                "env": {"CUDA_VISIBLE_DEVICES": inst.uuid, "NVIDIA_VISIBLE_DEVICES": inst.uuid},
            }
        )
    return {
        "tasks": tasks,
        "ring_gbps": 0.0,
        "fabric_domain": None,
        "network_blocks": [],
        "reason": reason,
    }
