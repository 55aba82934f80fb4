"""Shared building blocks of the simulated machine profiles.

A profile is described once as a ``Machine``: plain, immutable specs of its
GPUs, NUMA nodes, NICs, CPU links and MIG instances, with the link matrix as
``nvidia-smi topo -m`` labels. ``assemble`` turns a ``Machine`` plus a node
identity into a validated ``NodeSnapshot``, creating fresh model objects
each time so that no two snapshots share mutable state.

Everything is deterministic: GPU and MIG UUIDs are UUID5 values of the node
name and device position, and the timestamp is a fixed instant advanced by
``seq`` seconds, so equal arguments always give equal snapshots.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from placement.cpuset import format_cpuset
from placement.snapshot import (
    CpuIsa,
    CpuLink,
    CpuLinkKind,
    Fabric,
    Gpu,
    MigInstance,
    Nic,
    NodeSnapshot,
    NumaNode,
)

DRIVER_VERSION = "570.124.06"
CUDA_VERSION = "12.8"
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)

# Every simulated UUID is a UUID5 under this namespace.
_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "profiles.topoplace.io")

Matrix = tuple[tuple[str, ...], ...]


@dataclass(frozen=True, slots=True)
class GpuSpec:
    model: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int | None
    mig_enabled: bool = False


@dataclass(frozen=True, slots=True)
class NumaSpec:
    id: int
    cpus: str
    memory_mib: int


@dataclass(frozen=True, slots=True)
class NicSpec:
    name: str
    links: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CpuLinkSpec:
    gpu: int
    kind: CpuLinkKind
    bandwidth_gbps: float | None = None


@dataclass(frozen=True, slots=True)
class MigSpec:
    gpu: int
    profile: str
    start: int
    size: int


@dataclass(frozen=True, slots=True)
class Machine:
    """Everything about a simulated machine except its identity."""

    gpus: tuple[GpuSpec, ...]
    links: Matrix
    numa_nodes: tuple[NumaSpec, ...]
    cpu_isa: CpuIsa = "x86_64"
    cpu_links: tuple[CpuLinkSpec, ...] = ()
    nics: tuple[NicSpec, ...] = ()
    mig: tuple[MigSpec, ...] = ()
    # True where the GPUs join a multi-node NVLink domain (NVL72 trays): the
    # snapshot then carries a Fabric even when the caller did not pass one.
    multi_node_nvlink: bool = False


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a built snapshot claims to be."""

    node_name: str
    region: str = "default"
    labels: Mapping[str, str] | None = None
    seq: int = 0
    fabric: Fabric | None = None


def derived_uuid(*parts: str | int) -> uuid.UUID:
    """A UUID5 of the given parts, joined with '/'."""
    return uuid.uuid5(_NAMESPACE, "/".join(str(p) for p in parts))


def gpu_uuid(node_name: str, index: int) -> str:
    return f"GPU-{derived_uuid(node_name, 'gpu', index)}"


def mig_uuid(node_name: str, gpu: int, start: int) -> str:
    return f"MIG-{derived_uuid(node_name, 'gpu', gpu, 'mig', start)}"


def default_fabric(node_name: str, clique_id: int = 1) -> Fabric:
    """A completed fabric registration whose cluster UUID derives from ``node_name``."""
    return Fabric(cluster_uuid=str(derived_uuid("fabric", node_name)), clique_id=clique_id)


def cpus(*ranges: tuple[int, int]) -> str:
    """A cpuset from inclusive ``(first, last)`` ranges: ``cpus((0, 19), (40, 59))``."""
    return format_cpuset(cpu for lo, hi in ranges for cpu in range(lo, hi + 1))


def bus_ids(domain: int, buses: Sequence[int]) -> tuple[str, ...]:
    """PCI addresses as NVML prints them: ``00000000:18:00.0``."""
    return tuple(f"{domain:08X}:{bus:02X}:00.0" for bus in buses)


def parse_matrix(text: str) -> Matrix:
    """A whitespace-separated label matrix, one row a line, as nvidia-smi prints it."""
    return tuple(tuple(line.split()) for line in text.strip().splitlines())


def uniform_links(n: int, label: str) -> Matrix:
    """Every pair joined by the same link (NVSwitch boxes)."""
    return tuple(tuple("X" if i == j else label for j in range(n)) for i in range(n))


def numa_links(gpu_numa: Sequence[int], same: str, cross: str) -> Matrix:
    """PCIe-only wiring: ``same`` within one NUMA node, ``cross`` between nodes."""
    n = len(gpu_numa)
    return tuple(
        tuple("X" if i == j else (same if gpu_numa[i] == gpu_numa[j] else cross) for j in range(n))
        for i in range(n)
    )


def nic_links(
    near: Sequence[int], gpu_numa: Sequence[int], near_label: str, same: str, cross: str
) -> tuple[str, ...]:
    """A NIC's relation to each GPU: ``near_label`` to the GPUs sharing its PCIe
    switch, ``same`` to the rest of their NUMA node, ``cross`` to other nodes."""
    home = {gpu_numa[g] for g in near}
    return tuple(
        near_label if g in near else (same if numa in home else cross)
        for g, numa in enumerate(gpu_numa)
    )


def assemble(machine: Machine, ident: Identity) -> NodeSnapshot:
    """Build and validate the snapshot of ``machine`` as node ``ident``."""
    name = ident.node_name
    fabric = ident.fabric
    if fabric is None and machine.multi_node_nvlink:
        fabric = default_fabric(name)
    return NodeSnapshot(
        name=name,
        region=ident.region,
        labels=dict(ident.labels or {}),
        hostname=name,
        cpu_isa=machine.cpu_isa,
        numa_nodes=[
            NumaNode(id=node.id, cpus=node.cpus, memory_mib=node.memory_mib)
            for node in machine.numa_nodes
        ],
        gpus=[
            Gpu(
                index=i,
                uuid=gpu_uuid(name, i),
                model=spec.model,
                memory_mib=spec.memory_mib,
                pci_bus_id=spec.pci_bus_id,
                numa_node=spec.numa_node,
                mig_enabled=spec.mig_enabled,
            )
            for i, spec in enumerate(machine.gpus)
        ],
        links=[list(row) for row in machine.links],
        cpu_links=[
            CpuLink(gpu=link.gpu, kind=link.kind, bandwidth_gbps=link.bandwidth_gbps)
            for link in machine.cpu_links
        ],
        nics=[Nic(name=nic.name, links=list(nic.links)) for nic in machine.nics],
        mig_instances=[
            MigInstance(
                uuid=mig_uuid(name, mig.gpu, mig.start),
                parent_gpu=mig.gpu,
                profile=mig.profile,
                placement_start=mig.start,
                placement_size=mig.size,
            )
            for mig in machine.mig
        ],
        fabric=fabric,
        driver_version=DRIVER_VERSION,
        cuda_version=CUDA_VERSION,
        seq=ident.seq,
        timestamp=EPOCH + timedelta(seconds=ident.seq),
    )
