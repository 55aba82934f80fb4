"""PCIe machines: an 8x L40S server and a 2x RTX A6000 workstation.

- 8x L40S: exactly the real output in data/topologies/pcie-8x-l40s.txt: no
  NVLink, NODE between GPUs of one socket, SYS across; GPUs 0-3 on NUMA 0
  (CPUs 0-89), 4-7 on NUMA 1 (CPUs 90-179); one NIC, SYS to every GPU. That
  output's NIC legend does not name the device, so it is called mlx5_0 here.
- 2x RTX A6000: the NVLink-bridged pair of data/topologies/
  workstation-3x-a6000.txt (NV4) without the third, unbridged card, on a
  single-socket 32-core workstation with SMT (one NUMA node, CPUs 0-63).
"""

from __future__ import annotations

from placement.profiles._common import (
    GpuSpec,
    Machine,
    NicSpec,
    NumaSpec,
    bus_ids,
    cpus,
    numa_links,
)

L40S = ("NVIDIA L40S", 46068)
RTX_A6000 = ("NVIDIA RTX A6000", 49140)

_L40S_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)


def pcie_8x_l40s() -> Machine:
    model, memory_mib = L40S
    buses = bus_ids(0, (0x16, 0x38, 0x49, 0x5A, 0x98, 0xB8, 0xC8, 0xD8))
    return Machine(
        gpus=tuple(GpuSpec(model, memory_mib, buses[i], _L40S_NUMA[i]) for i in range(8)),
        links=numa_links(_L40S_NUMA, same="NODE", cross="SYS"),
        numa_nodes=(
            NumaSpec(0, cpus((0, 89)), 262144),
            NumaSpec(1, cpus((90, 179)), 262144),
        ),
        nics=(NicSpec("mlx5_0", ("SYS",) * 8),),
    )


def workstation_2x_a6000() -> Machine:
    model, memory_mib = RTX_A6000
    buses = bus_ids(0, (0x21, 0x49))
    return Machine(
        gpus=tuple(GpuSpec(model, memory_mib, buses[i], 0) for i in range(2)),
        links=(("X", "NV4"), ("NV4", "X")),
        numa_nodes=(NumaSpec(0, cpus((0, 63)), 262144),),
    )
