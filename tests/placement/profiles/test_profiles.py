"""Tests for the built-in simulated machine profiles."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from placement.bandwidth import bandwidth_matrix
from placement.cpuset import parse_cpuset
from placement.islands import islands
from placement.profiles import (
    PROFILE_NAMES,
    RACK_LABEL,
    UnknownProfileError,
    build_profile,
    gb200_nvl72_rack,
    profile_description,
    profile_names,
)
from placement.profiles.mig import MIG_80GB_PLACEMENTS, with_mig
from placement.profiles.nvswitch import hgx_h100
from placement.snapshot import Fabric, NodeSnapshot

REQUIRED = (
    "dgx1-v100",
    "dgx-a100",
    "hgx-h100",
    "hgx-b200",
    "pcie-8x-l40s",
    "workstation-2x-a6000",
    "gb200-tray",
    "riscv-nvlfusion-4",
    "dgx-a100-mig",
    "hgx-h100-mig",
)

GPU_COUNTS = {
    "dgx1-v100": 8,
    "dgx-a100": 8,
    "dgx-a100-40gb": 8,
    "hgx-h100": 8,
    "hgx-b200": 8,
    "dgx2-v100": 16,
    "pcie-8x-l40s": 8,
    "workstation-2x-a6000": 2,
    "gb200-tray": 4,
    "riscv-nvlfusion-4": 4,
    "dgx-a100-mig": 8,
    "hgx-h100-mig": 8,
}

MODELS = {
    "dgx1-v100": "Tesla V100-SXM2-32GB",
    "dgx-a100": "NVIDIA A100-SXM4-80GB",
    "hgx-h100": "NVIDIA H100 80GB HBM3",
    "hgx-b200": "NVIDIA B200",
    "dgx2-v100": "Tesla V100-SXM3-32GB",
    "pcie-8x-l40s": "NVIDIA L40S",
    "workstation-2x-a6000": "NVIDIA RTX A6000",
    "gb200-tray": "NVIDIA GB200",
}

_BUS_ID_RE = re.compile(r"^[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]$")


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(n) for j in range(n) if i != j]


# --- the registry --------------------------------------------------------


def test_required_profiles_are_registered():
    assert set(REQUIRED) <= set(PROFILE_NAMES)
    assert profile_names() == PROFILE_NAMES
    assert len(set(PROFILE_NAMES)) == len(PROFILE_NAMES)
    assert set(GPU_COUNTS) == set(PROFILE_NAMES)


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_description_is_one_line(name: str):
    text = profile_description(name)
    assert text.strip() == text
    assert text
    assert "\n" not in text


def test_unknown_profile_lists_known_names():
    with pytest.raises(UnknownProfileError) as info:
        build_profile("dgx-9000", "node-a")
    assert isinstance(info.value, ValueError)
    assert "dgx-9000" in str(info.value)
    for name in PROFILE_NAMES:
        assert name in str(info.value)
    with pytest.raises(UnknownProfileError):
        profile_description("dgx-9000")


# --- every profile -------------------------------------------------------


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_profile_builds_a_valid_snapshot(name: str):
    snap = build_profile(name, "node-a")
    assert isinstance(snap, NodeSnapshot)
    assert snap.name == "node-a"
    assert snap.hostname == "node-a"
    assert snap.gpu_count == GPU_COUNTS[name]
    assert snap.driver_version == "570.124.06"
    assert snap.cuda_version == "12.8"
    # Round trip through the validating constructor.
    assert NodeSnapshot.model_validate(snap.model_dump()) == snap
    assert NodeSnapshot.model_validate_json(snap.model_dump_json()) == snap


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_gpu_identities_are_realistic(name: str):
    snap = build_profile(name, "node-a")
    uuids = [g.uuid for g in snap.gpus]
    assert len(set(uuids)) == len(uuids)
    for gpu in snap.gpus:
        assert re.match(
            r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-5[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$", gpu.uuid
        )
        assert _BUS_ID_RE.match(gpu.pci_bus_id), gpu.pci_bus_id
        assert gpu.memory_mib > 16 * 1024
    bus_ids = [g.pci_bus_id for g in snap.gpus]
    assert len(set(bus_ids)) == len(bus_ids)
    base = name.removesuffix("-mig")
    if base in MODELS:
        assert {g.model for g in snap.gpus} == {MODELS[base]}


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_numa_layout_is_consistent(name: str):
    snap = build_profile(name, "node-a")
    assert snap.numa_nodes
    seen: set[int] = set()
    for node in snap.numa_nodes:
        cpus = set(node.cpu_list)
        assert cpus
        assert not cpus & seen, "NUMA nodes share CPUs"
        seen |= cpus
        assert node.memory_mib > 0
    ids = {n.id for n in snap.numa_nodes}
    for gpu in snap.gpus:
        assert gpu.numa_node in ids


@pytest.mark.parametrize("name", PROFILE_NAMES)
def test_builds_are_deterministic(name: str):
    first = build_profile(name, "node-a", seq=3)
    second = build_profile(name, "node-a", seq=3)
    assert first == second
    assert first.model_dump_json() == second.model_dump_json()
    other = build_profile(name, "node-b", seq=3)
    assert not {g.uuid for g in first.gpus} & {g.uuid for g in other.gpus}
    assert not {m.uuid for m in first.mig_instances} & {m.uuid for m in other.mig_instances}


def test_identity_arguments_are_applied():
    fabric = Fabric(cluster_uuid="c-1", clique_id=7)
    snap = build_profile(
        "hgx-h100", "node-a", region="eu-west", labels={"zone": "a"}, seq=5, fabric=fabric
    )
    assert snap.region == "eu-west"
    assert snap.labels == {"zone": "a"}
    assert snap.seq == 5
    assert snap.fabric == fabric
    assert snap.fabric_domain() == "c-1/7"
    assert snap.timestamp > build_profile("hgx-h100", "node-a").timestamp
    assert build_profile("hgx-h100", "node-a").fabric is None


def test_labels_argument_is_not_shared():
    labels = {"zone": "a"}
    snap = build_profile("hgx-h100", "node-a", labels=labels)
    labels["zone"] = "b"
    assert snap.labels == {"zone": "a"}


def test_invalid_node_name_is_refused():
    with pytest.raises(ValidationError):
        build_profile("hgx-h100", "Node_A")


# --- wiring: islands and bandwidth ----------------------------------------


def test_dgx1_is_one_island_with_cube_mesh_bandwidth():
    snap = build_profile("dgx1-v100", "node-a")
    assert [i.gpus for i in islands(snap)] == [tuple(range(8))]
    bw = bandwidth_matrix(snap)
    assert bw[0, 3] == 50
    assert bw[0, 1] == 25
    assert bw[0, 5] == 8
    assert bw[0, 4] == 50
    assert np.array_equal(bw, bw.T)
    # Six NVLink lanes per V100.
    for i in range(8):
        lanes = sum(snap.link(i, j).lanes for j in range(8) if snap.link(i, j).is_nvlink)
        assert lanes == 6


def test_dgx1_nics():
    snap = build_profile("dgx1-v100", "node-a")
    assert [n.name for n in snap.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert snap.nics[0].links == ["PIX", "PIX", "PHB", "PHB", "SYS", "SYS", "SYS", "SYS"]
    assert [g.numa_node for g in snap.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert snap.numa_cpus(0) == parse_cpuset("0-19,40-59")
    assert snap.numa_cpus(1) == parse_cpuset("20-39,60-79")


@pytest.mark.parametrize(
    ("name", "gbps"),
    [
        ("dgx-a100", 300.0),
        ("hgx-h100", 450.0),
        ("hgx-b200", 900.0),
        ("gb200-tray", 900.0),
        ("riscv-nvlfusion-4", 900.0),
        ("hgx-h100-mig", 450.0),
    ],
)
def test_nvswitch_profiles_are_uniform(name: str, gbps: float):
    snap = build_profile(name, "node-a")
    assert len(islands(snap)) == 1
    bw = bandwidth_matrix(snap)
    for i, j in _pairs(snap.gpu_count):
        assert bw[i, j] == gbps
        assert snap.links[i][j].startswith("NVS")


def test_l40s_has_no_nvlink():
    snap = build_profile("pcie-8x-l40s", "node-a")
    assert [(i.kind, i.gpus) for i in islands(snap)] == [
        ("pcie", (0, 1, 2, 3)),
        ("pcie", (4, 5, 6, 7)),
    ]
    bw = bandwidth_matrix(snap)
    for i, j in _pairs(8):
        assert bw[i, j] == (12 if (i < 4) == (j < 4) else 8)
    assert snap.numa_cpus(0) == tuple(range(90))
    assert snap.numa_cpus(1) == tuple(range(90, 180))


def test_a6000_pair_is_one_island():
    snap = build_profile("workstation-2x-a6000", "node-a")
    assert [i.gpus for i in islands(snap)] == [(0, 1)]
    assert snap.links[0][1] == "NV4"
    assert len(snap.numa_nodes) == 1


def test_dgx_a100_numa_and_nics():
    snap = build_profile("dgx-a100", "node-a")
    assert len(snap.numa_nodes) == 8
    assert sum(len(n.cpu_list) for n in snap.numa_nodes) == 256
    assert all(len(n.cpu_list) == 32 for n in snap.numa_nodes)
    assert [g.numa_node for g in snap.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert snap.numa_cpus(3) == parse_cpuset("48-63,176-191")
    assert len(snap.nics) == 8
    for nic in snap.nics:
        near = [g for g, label in enumerate(nic.links) if label == "PXB"]
        assert len(near) == 2
        assert near[0] % 2 == 0 and near[1] == near[0] + 1
        assert snap.gpus[near[0]].numa_node == snap.gpus[near[1]].numa_node


def test_b200_has_two_numa_nodes():
    snap = build_profile("hgx-b200", "node-a")
    assert len(snap.numa_nodes) == 2
    assert len(snap.nics) == 8


# --- GB200 and NVLink Fusion ------------------------------------------------


def test_gb200_tray_layout():
    snap = build_profile("gb200-tray", "tray-a")
    assert snap.cpu_isa == "aarch64"
    assert [len(n.cpu_list) for n in snap.numa_nodes] == [72, 72]
    assert [g.numa_node for g in snap.gpus] == [0, 0, 1, 1]
    assert sorted(link.gpu for link in snap.cpu_links) == [0, 1, 2, 3]
    assert {link.kind for link in snap.cpu_links} == {"nvlink-c2c"}


def test_gb200_tray_default_fabric_derives_from_node_name():
    a = build_profile("gb200-tray", "tray-a")
    assert a.fabric is not None
    assert a.fabric.state == "completed"
    assert a.fabric.clique_id == 1
    assert a.fabric_domain() is not None
    assert build_profile("gb200-tray", "tray-a").fabric == a.fabric
    assert build_profile("gb200-tray", "tray-b").fabric != a.fabric
    fabric = Fabric(cluster_uuid="rack-uuid", clique_id=4)
    assert build_profile("gb200-tray", "tray-a", fabric=fabric).fabric == fabric


def test_nvl72_rack():
    rack = gb200_nvl72_rack("r07", region="us-east", labels={"zone": "b"})
    assert len(rack) == 18
    assert [n.name for n in rack] == [f"r07-tray{i:02d}" for i in range(18)]
    assert sum(n.gpu_count for n in rack) == 72
    domains = {n.fabric_domain() for n in rack}
    assert len(domains) == 1 and None not in domains
    uuids = [g.uuid for n in rack for g in n.gpus]
    assert len(set(uuids)) == 72
    for node in rack:
        assert node.labels == {"zone": "b", RACK_LABEL: "r07"}
        assert node.region == "us-east"
        assert node.fabric is not None and node.fabric.state == "completed"
    assert gb200_nvl72_rack("r07", region="us-east", labels={"zone": "b"}) == rack
    other = gb200_nvl72_rack("r08")
    assert other[0].fabric_domain() != rack[0].fabric_domain()


def test_nvl72_rack_explicit_fabric_identity():
    rack = gb200_nvl72_rack("r01", cluster_uuid="abc-123", clique_id=9)
    assert {n.fabric_domain() for n in rack} == {"abc-123/9"}


def test_riscv_nvlink_fusion():
    snap = build_profile("riscv-nvlfusion-4", "rv-a")
    assert snap.cpu_isa == "riscv64"
    assert snap.gpu_count == 4
    assert sorted(link.gpu for link in snap.cpu_links) == [0, 1, 2, 3]
    assert {link.kind for link in snap.cpu_links} == {"nvlink-fusion"}
    assert 1 <= len(snap.numa_nodes) <= 2


# --- MIG -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["dgx-a100-mig", "hgx-h100-mig"])
def test_mig_instances_are_valid_placements(name: str):
    snap = build_profile(name, "node-a")
    assert snap.mig_instances
    taken: dict[int, set[int]] = {}
    for mig in snap.mig_instances:
        assert snap.gpus[mig.parent_gpu].mig_enabled
        assert mig.uuid.startswith("MIG-")
        size, starts = MIG_80GB_PLACEMENTS[mig.profile]
        assert mig.placement_size == size
        assert mig.placement_start in starts
        slices = set(range(mig.placement_start, mig.placement_start + mig.placement_size))
        assert slices <= set(range(8))
        assert not slices & taken.get(mig.parent_gpu, set())
        taken.setdefault(mig.parent_gpu, set()).update(slices)
    uuids = [m.uuid for m in snap.mig_instances] + [g.uuid for g in snap.gpus]
    assert len(set(uuids)) == len(uuids)


def test_dgx_a100_mig_layout():
    snap = build_profile("dgx-a100-mig", "node-a")
    assert [g.mig_enabled for g in snap.gpus] == [True] * 4 + [False] * 4
    by_gpu: dict[int, list[tuple[str, int, int]]] = {}
    for mig in snap.mig_instances:
        by_gpu.setdefault(mig.parent_gpu, []).append(
            (mig.profile, mig.placement_start, mig.placement_size)
        )
    assert by_gpu[0] == [("1g.10gb", s, 1) for s in range(7)]
    assert by_gpu[1] == [("2g.20gb", 0, 2), ("2g.20gb", 2, 2), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)]
    assert by_gpu[2] == [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]
    assert by_gpu[3] == [("4g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)]
    assert set(by_gpu) == {0, 1, 2, 3}
    # Same wiring as the plain profile.
    assert snap.links == build_profile("dgx-a100", "node-a").links


def test_hgx_h100_mig_uses_every_profile():
    snap = build_profile("hgx-h100-mig", "node-a")
    assert all(g.mig_enabled for g in snap.gpus)
    assert {m.profile for m in snap.mig_instances} == set(MIG_80GB_PLACEMENTS)
    assert {m.parent_gpu for m in snap.mig_instances} == set(range(8))
    full = [m for m in snap.mig_instances if m.profile == "7g.80gb"]
    assert [(m.placement_start, m.placement_size) for m in full] == [(0, 8)]


def test_mig_rejects_disallowed_start():
    with pytest.raises(ValueError, match="cannot start"):
        with_mig(hgx_h100(), {0: (("3g.40gb", 2),)})


def test_model_refuses_overlapping_mig():
    data = build_profile("dgx-a100-mig", "node-a").model_dump()
    clash = dict(data["mig_instances"][0], uuid="MIG-clash")
    data["mig_instances"].append(clash)
    with pytest.raises(ValidationError, match="overlap"):
        NodeSnapshot.model_validate(data)


# --- ground truth: real nvidia-smi topo -m outputs ------------------------------

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


def _topology_dir() -> Path | None:
    here = Path(__file__).resolve()
    candidates = [os.environ.get("TOPOPLACE_TOPOLOGY_DIR", "")]
    # The samples shipped in the package, so a fresh clone checks the profiles too.
    candidates += [str(here.parents[3] / "topoplace_client" / "samples")]
    candidates += [str(p / "shared" / "data" / "topologies") for p in here.parents]
    for candidate in candidates:
        if candidate and Path(candidate, "README.md").is_file():
            return Path(candidate)
    return None


def _read_topo(name: str) -> tuple[dict[str, list[str]], list[str], dict[str, str]]:
    """Rows by device name, the header, and the NIC legend of a topo -m output."""
    directory = _topology_dir()
    if directory is None:
        pytest.skip("real topology outputs (shared/data/topologies) not available")
    text = _ANSI_RE.sub("", (directory / name).read_text())
    lines = text.splitlines()
    header = [c.strip() for c in lines[0].split("\t")[1:]]
    rows: dict[str, list[str]] = {}
    legend: dict[str, str] = {}
    for line in lines[1:]:
        cells = [c.strip() for c in line.split("\t")]
        if len(cells) > 1 and re.match(r"^(GPU|NIC)\d+$", cells[0]):
            rows[cells[0]] = cells[1:]
        match = re.match(r"^\s+(NIC\d+):\s+(\S+)\s*$", line)
        if match:
            legend[match.group(1)] = match.group(2)
    return rows, header, legend


@pytest.mark.parametrize(
    ("profile", "filename"),
    [
        ("dgx1-v100", "dgx1-v100.txt"),
        ("hgx-h100", "hgx-h100.txt"),
        ("pcie-8x-l40s", "pcie-8x-l40s.txt"),
    ],
)
def test_gpu_matrix_matches_real_output(profile: str, filename: str):
    rows, _header, _legend = _read_topo(filename)
    snap = build_profile(profile, "node-a")
    for i in range(snap.gpu_count):
        printed = rows[f"GPU{i}"][: snap.gpu_count]
        # nvidia-smi prints NVSwitch links as NV<n>; the snapshot keeps NVS<n>.
        ours = [label.replace("NVS", "NV") for label in snap.links[i]]
        assert ours == printed


@pytest.mark.parametrize(
    ("profile", "filename"), [("hgx-h100", "hgx-h100.txt"), ("pcie-8x-l40s", "pcie-8x-l40s.txt")]
)
def test_numa_matches_real_output(profile: str, filename: str):
    rows, header, _legend = _read_topo(filename)
    snap = build_profile(profile, "node-a")
    cpu_col, numa_col = header.index("CPU Affinity"), header.index("NUMA Affinity")
    for gpu in snap.gpus:
        row = rows[f"GPU{gpu.index}"]
        assert gpu.numa_node == int(row[numa_col])
        assert snap.numa_cpus(gpu.numa_node) == parse_cpuset(row[cpu_col])


def test_dgx1_nics_match_real_output():
    rows, header, legend = _read_topo("dgx1-v100.txt")
    snap = build_profile("dgx1-v100", "node-a")
    nics = {nic.name: nic.links for nic in snap.nics}
    assert set(nics) == set(legend.values())
    for column, name in legend.items():
        col = header.index(column)
        assert nics[name] == [rows[f"GPU{g}"][col] for g in range(8)]
        assert nics[name] == rows[column][:8]
