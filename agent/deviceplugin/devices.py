"""What the plugin advertises for one resource, from the agent's view of the node.

Whole GPUs are ``nvidia.com/gpu`` (configurable), one device per GPU UUID;
MIG instances are ``nvidia.com/mig-<profile>``, one device per MIG UUID. A
device carries the NUMA node of its GPU and the number of its GPU's device
file (``/dev/nvidia<minor>``: NVML's minor number, not its index). A GPU the source no longer lists
(lost in NVML) is kept as Unhealthy rather than dropped: the kubelet then
stops giving it out but still counts pods holding it. With ``--device-specs``
a MIG instance also carries its capability files (mig_caps.py), or why they
are not known; then it is Unhealthy, as no container could open it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from agent.deviceplugin.mig_caps import MigCaps
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
    # A MIG instance's /dev/nvidia-caps files where found; else why not (empty for whole
    # GPUs, and where they were not looked for).
    caps: MigCaps | None = None
    caps_missing: str = ""


def mig_profile(resource: str) -> str | None:
    if resource.startswith(MIG_RESOURCE_PREFIX):
        return resource[len(MIG_RESOURCE_PREFIX) :]
    return None


def advertised(
    snapshot: NodeSnapshot, resource: str, caps: Mapping[str, MigCaps | str] | None = None
) -> list[Device]:
    """The devices of ``resource`` on the node as the snapshot describes it, in index order;
    ``caps``: each MIG instance's capability files, or why they are not known."""
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
        found = (caps or {}).get(m.uuid)
        if isinstance(found, MigCaps):
            out.append(Device(m.uuid, healthy, numa, minor, caps=found))
        else:
            # Without its capability files every admission of it fails (Allocate refuses
            # it): Unhealthy, so the kubelet stops choosing it, but still counts its pods.
            missing = found or ""
            out.append(Device(m.uuid, healthy and not missing, numa, minor, caps_missing=missing))
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
