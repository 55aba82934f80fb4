"""GB200 NVL72: one compute tray, and a whole rack of 18 trays.

A compute tray holds two GB200 superchips: two 72-core Grace CPUs (aarch64,
no SMT, one NUMA node each with 480 GB LPDDR5X) and four B200-class GPUs,
GPUs 0/1 on the first Grace and 2/3 on the second, each attached to its
Grace over NVLink-C2C (900 GB/s both ways, so 450 GB/s one direction). All
72 GPUs of the rack share the NVLink switch trays, so inside a tray every
pair is NVS18 (18 NVLink 5 lanes), and across trays the GPUs belong to one
multi-node NVLink domain, which NVML reports as the fabric's cluster UUID and
clique ID (it does not show in ``nvidia-smi topo -m``). Each tray has one
ConnectX-7 per GPU on that GPU's Grace (NODE to it, SYS to the other Grace).
PCI domains 0008/0009/0018/0019 are those GB200 trays report.
"""

from __future__ import annotations

from collections.abc import Mapping

from placement.profiles._common import (
    CpuLinkSpec,
    GpuSpec,
    Identity,
    Machine,
    NicSpec,
    NumaSpec,
    assemble,
    cpus,
    derived_uuid,
    nic_links,
    uniform_links,
)
from placement.snapshot import Fabric, NodeSnapshot

GB200 = ("NVIDIA GB200", 189471)
C2C_GBPS = 450.0
TRAYS_PER_RACK = 18
RACK_LABEL = "topoplace.io/rack"

_GPU_NUMA = (0, 0, 1, 1)
_BUSES = ("00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")


def gb200_tray() -> Machine:
    model, memory_mib = GB200
    return Machine(
        gpus=tuple(GpuSpec(model, memory_mib, _BUSES[i], _GPU_NUMA[i]) for i in range(4)),
        links=uniform_links(4, "NVS18"),
        numa_nodes=(
            NumaSpec(0, cpus((0, 71)), 491520),
            NumaSpec(1, cpus((72, 143)), 491520),
        ),
        cpu_isa="aarch64",
        cpu_links=tuple(CpuLinkSpec(g, "nvlink-c2c", C2C_GBPS) for g in range(4)),
        nics=tuple(
            NicSpec(f"mlx5_{g}", nic_links((g,), _GPU_NUMA, "NODE", "NODE", "SYS"))
            for g in range(4)
        ),
        multi_node_nvlink=True,
    )


def tray_name(rack: str, tray: int) -> str:
    return f"{rack}-tray{tray:02d}"


def gb200_nvl72_rack(
    rack: str,
    *,
    cluster_uuid: str | None = None,
    clique_id: int = 1,
    region: str = "default",
    labels: Mapping[str, str] | None = None,
) -> list[NodeSnapshot]:
    """The 18 compute trays of one NVL72 rack, ``<rack>-tray00`` .. ``<rack>-tray17``.

    All trays share one completed fabric registration: ``cluster_uuid`` (by
    default a UUID derived from the rack name) and ``clique_id``. Each tray is
    labelled ``topoplace.io/rack=<rack>`` on top of ``labels``.
    """
    fabric = Fabric(
        cluster_uuid=cluster_uuid if cluster_uuid is not None else str(derived_uuid("nvl72", rack)),
        clique_id=clique_id,
        state="completed",
    )
    tray_labels = {**(labels or {}), RACK_LABEL: rack}
    machine = gb200_tray()
    return [
        assemble(
            machine,
            Identity(tray_name(rack, i), region=region, labels=tray_labels, fabric=fabric),
        )
        for i in range(TRAYS_PER_RACK)
    ]
