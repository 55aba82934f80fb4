"""What the device plugin and the service say to each other about one node's pods.

The plugin (``topoplace device-plugin``, agent/deviceplugin/) asks for the
reservations the extender made on its node, to answer the kubelet, and
reports what the kubelet really allocated (its PodResources API), so the
service's allocations follow the truth. Field names are the plugin's JSON.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from placement.snapshot import DEVICE_UUID_PATTERN, DeviceUuid

DeviceId = str  # a GPU UUID or a MIG UUID, as NVML and the kubelet name it
# A device a node reports: as a snapshot's UUIDs are (placement/snapshot.py checks the
# pattern itself, here pydantic does, so the refusal names pods.N.devices.M).
_ReportedDevice = Annotated[DeviceUuid, Field(pattern=DEVICE_UUID_PATTERN)]
_ID = Field(min_length=1, max_length=128)
# What Kubernetes lets a namespace (a DNS-1123 label) and a pod (a DNS-1123 subdomain) be
# called. A report's names are the node's word: they go into the API server's path (where
# a "/" would name another object) and the service's log (where a line break forges lines),
# so a name no pod can have is refused with the field named.
_NAMESPACE = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_POD_NAME = Field(
    min_length=1,
    max_length=253,
    pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
)


class PodReservation(BaseModel):
    allocation_id: str
    state: Literal["pending", "active", "degraded"]
    namespace: str
    pod: str
    pod_uid: str | None
    resource: str = Field(
        description="the resource its devices are: nvidia.com/gpu or nvidia.com/mig-<profile>"
    )
    devices: list[DeviceId] = Field(description="GPU or MIG UUIDs, in the reservation's order")
    gpu_indices: list[int]
    numa_nodes: list[int]
    nvlink_connected: bool = Field(description="every pair of its GPUs is joined by NVLink")
    created_at: datetime


class NodeReservations(BaseModel):
    node: str
    reservations: list[PodReservation] = Field(description="oldest first: the order pods bound")


class PodDevices(BaseModel):
    model_config = ConfigDict(extra="forbid")

    namespace: str = _NAMESPACE
    name: str = _POD_NAME
    # Bounded and spelled as a snapshot's UUIDs are: a refused device is echoed in the
    # answer's detail and the log, so one a GPU cannot be named is refused with its field.
    devices: list[_ReportedDevice] = Field(min_length=1, max_length=64)


class DeviceReport(BaseModel):
    """Every pod the kubelet's PodResources List shows with devices of ``resource``."""

    model_config = ConfigDict(extra="forbid")

    resource: str = Field(
        min_length=1,
        max_length=253,
        pattern=r"^[a-z0-9.\-]+/[a-z0-9.\-]+$",
        examples=["nvidia.com/gpu"],
    )
    pods: list[PodDevices] = Field(max_length=1000)
    listed_at: AwareDatetime | None = Field(
        default=None,
        description="when the plugin read the kubelet's List, by the node's clock: a pod"
        " the kubelet started (status.startTime) after it, or within that second, is not"
        " in it, and the devices under its name are an earlier pod's (deferred)",
    )


ReportAction = Literal["matched", "moved", "created", "deferred", "unmatched"]


class PodOutcome(BaseModel):
    namespace: str
    name: str
    action: ReportAction = Field(
        description="matched: the reservation is what the kubelet gave; moved: the pod's"
        " allocation now holds the devices it really got; created: a pod without a reservation"
        " got one; deferred: nothing changed now, reported again later (the pod could not be"
        " read from the Kubernetes API, or it is not bound to this node there); unmatched:"
        " differs, but is not moved here (a gang member given its gang's other GPUs, or MIG"
        " instances of one): counted, see message"
    )
    allocation_id: str | None = None
    message: str = ""


class Mismatch(BaseModel):
    at: datetime
    node: str
    namespace: str
    pod: str
    action: ReportAction
    allocation_id: str | None
    reserved: list[DeviceId] = Field(description="what the service held for the pod before")
    allocated: list[DeviceId] = Field(description="what the kubelet gave it")
    superseded: list[str] = Field(description="allocations of others released: they held these")


class MismatchCounts(BaseModel):
    moved: int = 0
    created: int = 0
    unmatched: int = 0
    superseded: int = 0


class DeviceReportResult(BaseModel):
    node: str
    outcomes: list[PodOutcome]
    mismatches: MismatchCounts = Field(
        description="this node's, since the service started (every node's: GET /v1/k8s/mismatches)"
    )


class Mismatches(BaseModel):
    counts: MismatchCounts
    recent: list[Mismatch] = Field(description="the latest, newest last")
