"""`serve --demo`: a small simulated cluster reported through the same path agents use."""

from __future__ import annotations

from placement import NodeSnapshot
from placement.profiles import build_profile, gb200_nvl72_rack
from service.nodes.schemas import SnapshotReport
from service.nodes.service import heartbeat, report_snapshot
from service.state import ServiceState

# A small mixed fleet: NVSwitch, cube-mesh, PCIe-only, RISC-V over NVLink
# Fusion, MIG, and part of a GB200 NVL72 rack.
DEMO_FLEET: tuple[tuple[str, str], ...] = (
    ("hgx-h100", "h100-a"),
    ("hgx-h100", "h100-b"),
    ("dgx-a100", "a100-a"),
    ("dgx1-v100", "v100-a"),
    ("dgx1-v100", "v100-b"),
    ("pcie-8x-l40s", "l40s-a"),
    ("riscv-nvlfusion-4", "riscv-a"),
    ("dgx-a100-mig", "a100-mig-a"),
)


def demo_snapshots() -> list[NodeSnapshot]:
    snaps = [
        build_profile(profile, name, labels={"topoplace.io/demo": "true"})
        for profile, name in DEMO_FLEET
    ]
    snaps += gb200_nvl72_rack("gb200-r1", clique_id=1)[:4]
    return snaps


def register_demo_cluster(state: ServiceState) -> list[str]:
    names = []
    for snap in demo_snapshots():
        stored = state.cluster.node(snap.name).snapshot if snap.name in state.cluster else None
        report = snap if stored is None else snap.model_copy(update={"seq": stored.seq})
        report_snapshot(state, snap.name, SnapshotReport(snapshot=report))
        names.append(snap.name)
    return names


def heartbeat_demo_cluster(state: ServiceState, names: list[str]) -> None:
    for name in names:
        heartbeat(state, name)
