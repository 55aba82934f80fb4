from __future__ import annotations

import pytest
from pydantic import ValidationError

from placement import BandwidthTable, ClusterState, PlacementRequest, bandwidth_matrix
from placement.gpu_family import gpu_family
from placement.links import LinkKind, LinkLabelError, parse_link
from placement.profiles import build_profile


def test_default_table_matches_the_documented_numbers() -> None:
    table = BandwidthTable()
    assert table.pcie_gbps == {"PIX": 24, "PXB": 20, "PHB": 16, "NODE": 12, "SYS": 8}
    assert table.lane_rate("Tesla P100-SXM2-16GB", "Tesla P100-SXM2-16GB") == 20
    assert table.lane_rate("NVIDIA H200", "NVIDIA A100-SXM4-80GB") == 25
    assert table.lane_rate("NVIDIA B200", "NVIDIA GB200") == 50
    assert table.lane_rate("Mystery GPU", "Mystery GPU") == 25
    assert table.lane_rate("NVIDIA B200", "NVIDIA H100") == 25  # the slower end counts


def test_overrides_merge_and_validate() -> None:
    table = BandwidthTable(nvlink_lane_gbps={"Volta": 30}, pcie_gbps={"soc": 4})
    assert table.nvlink_lane_gbps["volta"] == 30 and table.nvlink_lane_gbps["hopper"] == 25
    assert table.pcie_gbps["SYS"] == 4
    with pytest.raises(ValidationError, match="unknown PCIe level"):
        BandwidthTable(pcie_gbps={"QPI": 5})
    with pytest.raises(ValidationError, match="must be positive"):
        BandwidthTable(nvlink_lane_gbps={"hopper": 0})


def test_override_changes_the_choice() -> None:
    # If SYS were faster than NV1 (absurd, but it shows the table is honoured),
    # a 2-GPU job on a DGX-1 would leave NVLink.
    snap = build_profile("dgx1-v100", "d0")
    assert bandwidth_matrix(snap)[0, 3] == 50
    state = ClusterState(bandwidth=BandwidthTable(pcie_gbps={"SYS": 500}))
    state.upsert(snap)
    outcome = state.place(PlacementRequest(gpus=2))
    assert outcome.placement is not None and not outcome.placement.tasks[0].nvlink_connected


def test_link_labels() -> None:
    assert parse_link("NV12").lanes == 12 and parse_link("nvs18").kind is LinkKind.NVSWITCH
    assert parse_link("SOC").kind is LinkKind.SYS
    for bad in ("NV", "NV0", "FOO", ""):
        with pytest.raises(LinkLabelError):
            parse_link(bad)


def test_families() -> None:
    assert gpu_family("NVIDIA GB200") == "blackwell"
    assert gpu_family("NVIDIA H20") == "hopper"
    assert gpu_family("NVIDIA H200 141GB") == "hopper"
    assert gpu_family("Tesla V100-SXM2-32GB") == "volta"
    assert gpu_family("Radeon") == "unknown"
