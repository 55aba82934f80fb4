"""DGX-1 with 8x Tesla V100-SXM2-32GB: the NVLink hybrid cube-mesh.

The GPU-GPU matrix and the NIC relations are those of a real DGX-1 class
machine's ``nvidia-smi topo -m`` (data/topologies/dgx1-v100.txt): each GPU
has six NVLink 2 lanes, bonded as NV1 or NV2 to four peers, and reaches the
other three over SYS. The file's NICs are listed in bus order with the legend
NIC0=mlx5_2, NIC1=mlx5_0, NIC2=mlx5_3, NIC3=mlx5_1; here they are listed by
name. That output reports no NUMA values, so the NUMA layout is the usual
one of a DGX-1 (two 20-core Xeon E5-2698 v4 with Hyper-Threading, 512 GB):
GPUs 0-3 and mlx5_0/1 on socket 0, GPUs 4-7 and mlx5_2/3 on socket 1.
"""

from __future__ import annotations

from placement.profiles._common import (
    GpuSpec,
    Machine,
    NicSpec,
    NumaSpec,
    bus_ids,
    cpus,
    parse_matrix,
)

MODEL = "Tesla V100-SXM2-32GB"
MEMORY_MIB = 32768

LINKS = parse_matrix(
    """
    X   NV1 NV1 NV2 NV2 SYS SYS SYS
    NV1 X   NV2 NV1 SYS NV2 SYS SYS
    NV1 NV2 X   NV2 SYS SYS NV1 SYS
    NV2 NV1 NV2 X   SYS SYS SYS NV1
    NV2 SYS SYS SYS X   NV1 NV1 NV2
    SYS NV2 SYS SYS NV1 X   NV2 NV1
    SYS SYS NV1 SYS NV1 NV2 X   NV2
    SYS SYS SYS NV1 NV2 NV1 NV2 X
    """
)

NICS = (
    NicSpec("mlx5_0", ("PIX", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS")),
    NicSpec("mlx5_1", ("PHB", "PHB", "PIX", "PIX", "SYS", "SYS", "SYS", "SYS")),
    NicSpec("mlx5_2", ("SYS", "SYS", "SYS", "SYS", "PIX", "PIX", "PHB", "PHB")),
    NicSpec("mlx5_3", ("SYS", "SYS", "SYS", "SYS", "PHB", "PHB", "PIX", "PIX")),
)

_BUSES = bus_ids(0, (0x06, 0x07, 0x0A, 0x0B, 0x85, 0x86, 0x89, 0x8A))


def dgx1_v100() -> Machine:
    return Machine(
        gpus=tuple(
            GpuSpec(MODEL, MEMORY_MIB, _BUSES[i], numa_node=0 if i < 4 else 1) for i in range(8)
        ),
        links=LINKS,
        numa_nodes=(
            NumaSpec(0, cpus((0, 19), (40, 59)), 262144),
            NumaSpec(1, cpus((20, 39), (60, 79)), 262144),
        ),
        nics=NICS,
    )
