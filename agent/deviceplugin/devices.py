"""What the plugin advertises for one resource, from the agent's view of the node.

Whole GPUs are ``nvidia.com/gpu`` (configurable), one device per GPU UUID;
MIG instances are ``nvidia.com/mig-<profile>``, one device per MIG UUID. A
device carries the NUMA node of its GPU and the number of its GPU's device
file (``/dev/nvidia<minor>``: NVML's minor number, not its index). A GPU the source no longer lists
(lost in NVML) is kept as Unhealthy rather than dropped: the kubelet then
stops giving it out but still counts pods holding it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from placement.snapshot import Health, NodeSnapshot

MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
HEALTHY = "Healthy"  # the kubelet's own words (deviceplugin v1beta1 constants)
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Device:
    id: str
    healthy: bool
    numa_node: int | None
    # /dev/nvidia<minor> of the whole GPU it is, or of the MIG instance's parent: the
    # GPU's minor number where the agent read one, else its index.
    minor: int


def mig_profile(resource: str) -> str | None:
    if resource.startswith(MIG_RESOURCE_PREFIX):
        return resource[len(MIG_RESOURCE_PREFIX) :]
    return None


def advertised(snapshot: NodeSnapshot, resource: str) -> list[Device]:
    """The devices of ``resource`` on the node as the snapshot describes it, in index order."""
    profile = mig_profile(resource)
    if profile is None:
        return [
            Device(g.uuid, g.health == Health.HEALTHY, g.numa_node, g.device_minor)
            for g in snapshot.gpus
            if not g.mig_enabled
        ]
    parents = {g.index: g for g in snapshot.gpus}
    out = []
    for m in snapshot.mig_instances:
        if m.profile != profile:
            continue
        parent = parents.get(m.parent_gpu)
        healthy = m.health == Health.HEALTHY and (parent is None or parent.health == Health.HEALTHY)
        numa = parent.numa_node if parent else None
        minor = parent.device_minor if parent else m.parent_gpu
        out.append(Device(m.uuid, healthy, numa, minor))
    return out


def merge(previous: list[Device], now: list[Device]) -> list[Device]:
    """``now``, plus every device of ``previous`` it lost, marked Unhealthy."""
    seen = {d.id for d in now}
    lost = [replace(d, healthy=False) for d in previous if d.id not in seen]
    return [*now, *lost]


def resources_of(snapshot: NodeSnapshot, whole: str) -> list[str]:
    """Every resource the node has devices of: whole GPUs, then each MIG profile present."""
    out = [whole] if any(not g.mig_enabled for g in snapshot.gpus) else []
    for profile in sorted({m.profile for m in snapshot.mig_instances}):
        out.append(MIG_RESOURCE_PREFIX + profile)
    return out
