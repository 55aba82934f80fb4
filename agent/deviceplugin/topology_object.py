"""The node's NodeResourceTopology object (``topology.node.k8s.io/v1alpha2``).

The CRD of node-feature-discovery's topology updater and of the NUMA-aware
scheduler plugin (integrations/kubernetes/noderesourcetopology-crd.yaml): one
object per node, named after it, with a zone per NUMA node holding that
zone's devices of each resource (capacity: all, allocatable: the healthy
ones, available: healthy and not held by a pod), and as attributes the
labels ``topoplace k8s labels`` prints (NVLink islands, clique, GPU count
and model). ``kubectl get noderesourcetopologies`` then shows the wiring.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agent.deviceplugin.devices import Device
from placement.islands import islands
from placement.snapshot import NodeSnapshot

API_VERSION = "topology.node.k8s.io/v1alpha2"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"


def _label_value(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text)[:63].strip("-._")


def node_attributes(snapshot: NodeSnapshot) -> dict[str, str]:
    """What ``topoplace k8s labels`` says of the node, from the snapshot itself."""
    # As topoplace k8s labels: PCIe groups are no NVLink islands; a lone GPU is one of 1.
    sizes = [island.size for island in islands(snapshot) if island.is_nvlink]
    out = {
        "topology.k8s.io/nvlink.islands": str(sum(1 for s in sizes if s >= 2)),
        "topology.k8s.io/nvlink.island-size": str(max(sizes, default=min(1, len(snapshot.gpus)))),
        "topoplace.io/gpu.count": str(len(snapshot.gpus)),
    }
    models = {g.model for g in snapshot.gpus}
    if len(models) == 1:
        out["topoplace.io/gpu.model"] = _label_value(models.pop())
    domain = snapshot.fabric_domain()
    if domain:
        out["nvidia.com/gpu.clique"] = _label_value(domain.replace("/", "."))
    return out


def node_resource_topology(
    snapshot: NodeSnapshot, devices: Mapping[str, list[Device]], held: set[str]
) -> dict[str, Any]:
    zones: dict[int, dict[str, list[Device]]] = {n.id: {} for n in snapshot.numa_nodes}
    for resource, listed in devices.items():
        for d in listed:
            zone = d.numa_node if d.numa_node is not None else 0
            zones.setdefault(zone, {}).setdefault(resource, []).append(d)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": snapshot.name},
        "attributes": [{"name": k, "value": v} for k, v in node_attributes(snapshot).items()],
        "zones": [
            {
                "name": f"node-{zone}",
                "type": "Node",
                "resources": [
                    {
                        "name": resource,
                        "capacity": len(listed),
                        "allocatable": sum(d.healthy for d in listed),
                        "available": sum(d.healthy and d.id not in held for d in listed),
                    }
                    for resource, listed in sorted(by_resource.items())
                ],
            }
            for zone, by_resource in sorted(zones.items())
        ],
    }
