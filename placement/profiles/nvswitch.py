"""8-GPU NVSwitch baseboards: DGX A100, HGX H100, HGX B200.

On these boards every GPU's NVLink lanes go to the NVSwitch chips, so every
pair of GPUs sees the same link: NVS12 on A100 (12 NVLink 3 lanes), NVS18
on H100 (18 NVLink 4 lanes) and B200 (18 NVLink 5 lanes).

- DGX A100: two 64-core AMD EPYC 7742 in NPS4 mode, i.e. 8 NUMA nodes of 16
  cores plus their SMT siblings (256 CPUs, 1 TB). GPU pairs sit behind PCIe
  switches on NUMA 3, 1, 7 and 5 (GPU0/1, 2/3, 4/5, 6/7), each switch with
  two ConnectX-6 NICs: PXB to its pair, SYS to everything else (nvidia-smi
  calls any other NUMA node SYS). Bus IDs are those of the DGX A100.
- HGX H100: NUMA nodes and CPU sets exactly as a real 8x H100 SXM output
  (data/topologies/hgx-h100.txt): GPUs 0-3 on NUMA 0 (0-47,96-143), 4-7 on
  NUMA 1 (48-95,144-191). One ConnectX-7 per GPU, PIX to it. Bus IDs as on
  a DGX H100.
- DGX-2: 16 GPUs (V100-SXM3-32GB) on two baseboards whose 12 NVSwitches
  are trunked together, so every pair sees NVS6; two 24-core Xeon Platinum
  8168 (96 CPUs), GPUs 0-7 on NUMA 0 and 8-15 on NUMA 1, one NIC per GPU pair.
- HGX B200: two 56-core Xeon Platinum 8570 (224 CPUs), GPUs 0-3 on NUMA 0,
  4-7 on NUMA 1, one ConnectX-7 per GPU. Bus IDs as on a DGX B200.
"""

from __future__ import annotations

from placement.profiles._common import (
    GpuSpec,
    Machine,
    NicSpec,
    NumaSpec,
    bus_ids,
    cpus,
    nic_links,
    uniform_links,
)

A100_80GB = ("NVIDIA A100-SXM4-80GB", 81920)
A100_40GB = ("NVIDIA A100-SXM4-40GB", 40960)
H100_80GB = ("NVIDIA H100 80GB HBM3", 81559)
B200 = ("NVIDIA B200", 183359)

# NPS4: NUMA node k holds cores 16k..16k+15 (nodes 0-3 on socket 0, 4-7 on
# socket 1) and their SMT siblings, numbered 128 higher.
_A100_NUMA = tuple(
    NumaSpec(k, cpus((16 * k, 16 * k + 15), (128 + 16 * k, 128 + 16 * k + 15)), 131072)
    for k in range(8)
)
_A100_GPU_NUMA = (3, 3, 1, 1, 7, 7, 5, 5)
_A100_BUSES = bus_ids(0, (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD))


def dgx_a100(gpu: tuple[str, int] = A100_80GB) -> Machine:
    model, memory_mib = gpu
    # Two NICs per PCIe switch: mlx5_0/1 with GPU0/1, mlx5_2/3 with GPU2/3, ...
    pairs = ((n, (n // 2 * 2, n // 2 * 2 + 1)) for n in range(8))
    nics = tuple(
        NicSpec(f"mlx5_{n}", nic_links(pair, _A100_GPU_NUMA, "PXB", "SYS", "SYS"))
        for n, pair in pairs
    )
    return Machine(
        gpus=tuple(GpuSpec(model, memory_mib, _A100_BUSES[i], _A100_GPU_NUMA[i]) for i in range(8)),
        links=uniform_links(8, "NVS12"),
        numa_nodes=_A100_NUMA,
        nics=nics,
    )


def _one_nic_per_gpu(gpu_numa: tuple[int, ...]) -> tuple[NicSpec, ...]:
    return tuple(
        NicSpec(f"mlx5_{g}", nic_links((g,), gpu_numa, "PIX", "NODE", "SYS"))
        for g in range(len(gpu_numa))
    )


_TWO_SOCKETS = (0, 0, 0, 0, 1, 1, 1, 1)


def hgx_h100() -> Machine:
    model, memory_mib = H100_80GB
    buses = bus_ids(0, (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB))
    return Machine(
        gpus=tuple(GpuSpec(model, memory_mib, buses[i], _TWO_SOCKETS[i]) for i in range(8)),
        links=uniform_links(8, "NVS18"),
        numa_nodes=(
            NumaSpec(0, cpus((0, 47), (96, 143)), 1048576),
            NumaSpec(1, cpus((48, 95), (144, 191)), 1048576),
        ),
        nics=_one_nic_per_gpu(_TWO_SOCKETS),
    )


def hgx_b200() -> Machine:
    model, memory_mib = B200
    buses = bus_ids(0, (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF))
    return Machine(
        gpus=tuple(GpuSpec(model, memory_mib, buses[i], _TWO_SOCKETS[i]) for i in range(8)),
        links=uniform_links(8, "NVS18"),
        numa_nodes=(
            NumaSpec(0, cpus((0, 55), (112, 167)), 2097152),
            NumaSpec(1, cpus((56, 111), (168, 223)), 2097152),
        ),
        nics=_one_nic_per_gpu(_TWO_SOCKETS),
    )


def dgx2_v100() -> Machine:
    model, memory_mib = ("Tesla V100-SXM3-32GB", 32768)
    gpu_numa = (0,) * 8 + (1,) * 8
    buses = bus_ids(
        0,
        (
            0x34,
            0x36,
            0x39,
            0x3B,
            0x57,
            0x59,
            0x5C,
            0x5E,
            0xB7,
            0xB9,
            0xBC,
            0xBE,
            0xE0,
            0xE2,
            0xE5,
            0xE7,
        ),
    )
    nics = tuple(
        NicSpec(f"mlx5_{n}", nic_links((2 * n, 2 * n + 1), gpu_numa, "PXB", "NODE", "SYS"))
        for n in range(8)
    )
    return Machine(
        gpus=tuple(GpuSpec(model, memory_mib, buses[i], gpu_numa[i]) for i in range(16)),
        links=uniform_links(16, "NVS6"),
        numa_nodes=(
            NumaSpec(0, cpus((0, 23), (48, 71)), 786432),
            NumaSpec(1, cpus((24, 47), (72, 95)), 786432),
        ),
        nics=nics,
    )
