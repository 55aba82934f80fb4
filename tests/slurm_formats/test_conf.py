from __future__ import annotations

import re

from placement.profiles import build_profile
from slurm_formats.conf import features, gpu_model_token, gres_conf_lines, node_conf_line


def test_gres_conf_of_a_dgx1_names_each_gpu_with_its_links_and_cores() -> None:
    lines = gres_conf_lines(build_profile("dgx1-v100", "node1"), "/tmp/dev/")
    assert len(lines) == 8
    assert lines[0] == (
        "NodeName=node1 Name=gpu Type=g0 File=/tmp/dev/nvidia0 Cores=0-19 Links=-1,1,1,2,2,0,0,0"
    )
    # GPU 5 sits on the second socket; its NVLink peers are 1 (NV2), 4 (NV1), 6 (NV2), 7 (NV1).
    assert lines[5].endswith("Type=g5 File=/tmp/dev/nvidia5 Cores=20-39 Links=0,2,0,0,1,-1,2,1")


def test_node_line_has_gres_features_and_the_cpu_layout() -> None:
    line = node_conf_line(build_profile("dgx1-v100", "node1"), "State=UNKNOWN")
    assert line == (
        "NodeName=node1 CPUs=80 Sockets=2 CoresPerSocket=20 ThreadsPerCore=2 RealMemory=524288"
        " Gres=gpu:g0:1,gpu:g1:1,gpu:g2:1,gpu:g3:1,gpu:g4:1,gpu:g5:1,gpu:g6:1,gpu:g7:1"
        " Features=gpu_v100,nvlink,nvisland8 State=UNKNOWN"
    )


def test_features_name_nvlink_domains_and_leave_pcie_boxes_without_nvlink() -> None:
    tray = features(build_profile("gb200-tray", "tray1"))
    assert tray[:3] == ["gpu_gb200", "nvlink", "nvisland4"]
    assert tray[3].startswith("nvdomain_")
    assert features(build_profile("pcie-8x-l40s", "l40s")) == ["gpu_l40s"]
    labelled = build_profile("hgx-h100", "h1", labels={"topoplace.io/block": "b-7"})
    assert "block_b_7" in features(labelled)


def test_model_tokens() -> None:
    assert gpu_model_token("Tesla V100-SXM2-32GB") == "v100"
    assert gpu_model_token("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_model_token("NVIDIA RTX A6000") == "a6000"


def _domain_feature(cluster_uuid: str, clique_id: int = 1) -> str:
    tray = build_profile("gb200-tray", "tray1")
    assert tray.fabric is not None
    fabric = tray.fabric.model_copy(update={"cluster_uuid": cluster_uuid, "clique_id": clique_id})
    snap = tray.model_copy(update={"fabric": fabric})
    (found,) = (f for f in features(snap) if f.startswith("nvdomain_"))
    return found


def test_each_nvlink_domain_has_its_own_feature() -> None:
    """`--constraint=nvdomain_...` keeps a job in one domain: two racks whose cluster UUIDs
    share their first 8 characters (or differ only in case or punctuation) must not share
    a feature, or a multi-node job could be started across both."""
    first = "1a2b3c4d-0000-4000-8000-000000000001"
    second = "1a2b3c4d-0000-4000-8000-000000000002"
    assert _domain_feature(first) != _domain_feature(second)
    assert _domain_feature(first) == "nvdomain_1a2b3c4d000040008000000000000001_1"
    assert _domain_feature(first, 1) != _domain_feature(first, 11)
    assert len({_domain_feature(u) for u in ("rack-a", "rack_a", "RACK-A", "racka")}) == 4
    for uuid in (first, "rack-a", "RACK-A", "x" * 64):
        feature = _domain_feature(uuid, 2**31 - 1)
        assert re.fullmatch(r"nvdomain_[a-z0-9]+_[0-9]+", feature), feature
