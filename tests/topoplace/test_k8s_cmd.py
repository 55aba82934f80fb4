"""`topoplace k8s labels NODE` against a real service on loopback."""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator

import httpx
import pytest

from placement.profiles import build_profile, gb200_nvl72_rack
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.live_server import live_server
from tests.topoplace.test_client_cmd import PROXY_VARIABLES
from topoplace import client_cmd
from topoplace.cli import main
from topoplace.k8s_cmd import label_value


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("k8s") / "t.sqlite3"
    app = create_app(Settings(database_url=f"sqlite:///{db}"))
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    with live_server(app) as url:
        snaps = [
            build_profile("hgx-h100", "h100-a"),
            build_profile("pcie-8x-l40s", "l40s-b"),
            build_profile("dgx1-v100", "v100-c"),
            gb200_nvl72_rack("rack7", clique_id=3)[0],
        ]
        for snap in snaps:
            body = {"snapshot": snap.model_dump(mode="json")}
            reply = httpx.put(f"{url}/v1/nodes/{snap.name}/snapshot", json=body, trust_env=False)
            assert reply.status_code == 200, reply.text
        yield url


@pytest.fixture(autouse=True)
def _plain_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*PROXY_VARIABLES, client_cmd.SERVER_ENV):
        monkeypatch.delenv(name, raising=False)


def _labels(server: str, capsys: pytest.CaptureFixture[str], node: str) -> dict[str, str]:
    assert main(["k8s", "labels", node, "--server", server, "--json"]) == 0
    labels: dict[str, str] = json.loads(capsys.readouterr().out)
    return labels


def test_an_nvswitch_box_is_one_island_of_eight(server: str, capsys: pytest.CaptureFixture[str]):
    labels = _labels(server, capsys, "h100-a")
    assert labels["topology.k8s.io/nvlink.islands"] == "1"
    assert labels["topology.k8s.io/nvlink.island-size"] == "8"
    assert labels["topoplace.io/gpu.count"] == "8"
    assert "H100" in labels["topoplace.io/gpu.model"]
    assert "nvidia.com/gpu.clique" not in labels


def test_a_pcie_box_has_no_nvlink_island(server: str, capsys: pytest.CaptureFixture[str]):
    labels = _labels(server, capsys, "l40s-b")
    assert labels["topology.k8s.io/nvlink.islands"] == "0"
    assert labels["topology.k8s.io/nvlink.island-size"] == "1"


def test_a_gb200_tray_names_its_clique(server: str, capsys: pytest.CaptureFixture[str]):
    tray = gb200_nvl72_rack("rack7", clique_id=3)[0]
    labels = _labels(server, capsys, tray.name)
    assert tray.fabric is not None
    assert labels["nvidia.com/gpu.clique"] == f"{tray.fabric.cluster_uuid}.3"
    assert labels["topology.k8s.io/nvlink.island-size"] == "4"


def test_every_value_is_a_valid_label_value(server: str, capsys: pytest.CaptureFixture[str]):
    for node in ("h100-a", "l40s-b", "v100-c"):
        for value in _labels(server, capsys, node).values():
            assert len(value) <= 63
            assert value == label_value(value) and value


def test_plain_and_kubectl_output(server: str, capsys: pytest.CaptureFixture[str]):
    assert main(["k8s", "labels", "v100-c", "--server", server]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "topology.k8s.io/nvlink.island-size=8" in lines
    assert main(["k8s", "labels", "v100-c", "--server", server, "--kubectl"]) == 0
    words = shlex.split(capsys.readouterr().out)
    assert words[:4] == ["kubectl", "label", "node", "v100-c"] and words[-1] == "--overwrite"
    assert set(words[4:-1]) == set(lines)


def test_an_unknown_node_exits_1(server: str, capsys: pytest.CaptureFixture[str]):
    assert main(["k8s", "labels", "nowhere", "--server", server]) == 1
    assert "not_found" in capsys.readouterr().err


def test_label_values_are_cleaned():
    assert label_value("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert label_value("--a/b--") == "a-b"
    assert len(label_value("x" * 100)) == 63
