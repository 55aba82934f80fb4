"""Built-in simulated machine profiles.

Each profile builds a realistic, valid ``NodeSnapshot`` of a known machine
design, programmatically and deterministically: tests, demos, the node
agent's simulated mode and the benchmarks all use them. The wiring of the
DGX-1 V100, HGX H100 and 8x L40S profiles follows real ``nvidia-smi topo -m``
outputs; the others follow the vendors' published system layouts. Each
family's module says where its facts come from.

>>> snap = build_profile("hgx-h100", "node-a")
>>> snap.gpu_count
8
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

from placement.profiles._common import Identity, Machine, assemble
from placement.profiles.dgx1 import dgx1_v100
from placement.profiles.gb200 import RACK_LABEL, gb200_nvl72_rack, gb200_tray
from placement.profiles.mig import dgx_a100_mig, hgx_h100_mig
from placement.profiles.nvswitch import A100_40GB, dgx2_v100, dgx_a100, hgx_b200, hgx_h100
from placement.profiles.pcie import pcie_8x_l40s, workstation_2x_a6000
from placement.profiles.riscv import riscv_nvlfusion_4
from placement.snapshot import Fabric, NodeSnapshot

__all__ = [
    "PROFILE_NAMES",
    "RACK_LABEL",
    "UnknownProfileError",
    "build_profile",
    "gb200_nvl72_rack",
    "profile_description",
    "profile_names",
]


@dataclass(frozen=True, slots=True)
class _Profile:
    build: Callable[[], Machine]
    description: str


_PROFILES: MappingProxyType[str, _Profile] = MappingProxyType(
    {
        "dgx1-v100": _Profile(
            dgx1_v100,
            "DGX-1: 8x Tesla V100-SXM2-32GB in an NVLink hybrid cube-mesh (NV1/NV2),"
            " 2 NUMA nodes, 4 NICs",
        ),
        "dgx-a100": _Profile(
            dgx_a100,
            "DGX A100: 8x A100-SXM4-80GB on NVSwitch (NVS12), AMD Rome NPS4 with 8 NUMA nodes,"
            " 8 NICs",
        ),
        "dgx-a100-40gb": _Profile(
            lambda: dgx_a100(A100_40GB),
            "DGX A100 40GB: the dgx-a100 layout with 8x A100-SXM4-40GB",
        ),
        "hgx-h100": _Profile(
            hgx_h100,
            "HGX H100: 8x H100 80GB HBM3 on NVSwitch (NVS18), 2 NUMA nodes, 8 NICs",
        ),
        "dgx2-v100": _Profile(
            dgx2_v100,
            "DGX-2: 16x Tesla V100-SXM3-32GB, every pair over NVSwitch (NVS6), 2 NUMA nodes",
        ),
        "hgx-b200": _Profile(
            hgx_b200,
            "HGX B200: 8x B200 on NVSwitch (NVS18, NVLink 5), 2 NUMA nodes, 8 NICs",
        ),
        "pcie-8x-l40s": _Profile(
            pcie_8x_l40s,
            "8x L40S over PCIe only: NODE within a socket, SYS across, 2 NUMA nodes",
        ),
        "workstation-2x-a6000": _Profile(
            workstation_2x_a6000,
            "Workstation: 2x RTX A6000 joined by an NVLink bridge (NV4), 1 NUMA node",
        ),
        "gb200-tray": _Profile(
            gb200_tray,
            "GB200 NVL72 compute tray: 4x GB200 (NVS18) on 2 Grace CPUs over NVLink-C2C,"
            " in a multi-node NVLink fabric",
        ),
        "riscv-nvlfusion-4": _Profile(
            riscv_nvlfusion_4,
            "RISC-V host with 4x B200 (NVS18) attached over NVLink Fusion, 2 NUMA nodes",
        ),
        "dgx-a100-mig": _Profile(
            dgx_a100_mig,
            "dgx-a100 with MIG on GPUs 0-3 (1g.10gb, 2g.20gb, 3g.40gb, 4g.40gb mixes)",
        ),
        "hgx-h100-mig": _Profile(
            hgx_h100_mig,
            "hgx-h100 with MIG on all 8 GPUs (1g.10gb up to 7g.80gb mixes)",
        ),
    }
)

PROFILE_NAMES: tuple[str, ...] = tuple(_PROFILES)


class UnknownProfileError(ValueError):
    """A profile name that is not among the built-in profiles."""

    def __init__(self, profile: str) -> None:
        self.profile = profile
        super().__init__(f"unknown profile {profile!r}; known profiles: {', '.join(PROFILE_NAMES)}")


def profile_names() -> tuple[str, ...]:
    return PROFILE_NAMES


def _lookup(profile: str) -> _Profile:
    try:
        return _PROFILES[profile]
    except KeyError:
        raise UnknownProfileError(profile) from None


def profile_description(profile: str) -> str:
    """One line saying what machine ``profile`` models."""
    return _lookup(profile).description


def build_profile(
    profile: str,
    node_name: str,
    *,
    region: str = "default",
    labels: dict[str, str] | None = None,
    seq: int = 0,
    fabric: Fabric | None = None,
) -> NodeSnapshot:
    """The snapshot of a ``profile`` machine named ``node_name``.

    Equal arguments give equal snapshots. ``fabric`` attaches the node to a
    multi-node NVLink domain; ``gb200-tray`` gets one derived from the node
    name when none is given.
    """
    machine = _lookup(profile).build()
    return assemble(
        machine,
        Identity(node_name, region=region, labels=labels, seq=seq, fabric=fabric),
    )
