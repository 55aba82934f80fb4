"""A RISC-V host with four GPUs over NVLink Fusion.

NVLink Fusion lets a third-party CPU join the NVLink domain in place of a
Grace. This profile models such a node: a 128-core riscv64 host in two NUMA
nodes of 64 harts (no SMT), four B200-class GPUs on one NVLink switch
(NVS18 between every pair), GPUs 0/1 on NUMA 0 and 2/3 on NUMA 1, and each
GPU's CPU link of kind ``nvlink-fusion``. No shipping machine is public
yet, so the CPU-GPU rate is an assumption: the NVLink-C2C rate of GB200
(450 GB/s one direction). The node has no NICs in this profile.
"""

from __future__ import annotations

from placement.profiles._common import CpuLinkSpec, GpuSpec, Machine, NumaSpec, cpus, uniform_links

MODEL = ("NVIDIA B200", 183359)
FUSION_GBPS = 450.0

_GPU_NUMA = (0, 0, 1, 1)


def riscv_nvlfusion_4() -> Machine:
    model, memory_mib = MODEL
    return Machine(
        gpus=tuple(
            GpuSpec(model, memory_mib, f"{i + 1:08X}:01:00.0", _GPU_NUMA[i]) for i in range(4)
        ),
        links=uniform_links(4, "NVS18"),
        numa_nodes=(
            NumaSpec(0, cpus((0, 63)), 524288),
            NumaSpec(1, cpus((64, 127)), 524288),
        ),
        cpu_isa="riscv64",
        cpu_links=tuple(CpuLinkSpec(g, "nvlink-fusion", FUSION_GBPS) for g in range(4)),
    )
