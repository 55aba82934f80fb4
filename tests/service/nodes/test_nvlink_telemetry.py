"""NVLink counters sent with heartbeats: kept per node, bounded in rate, refused when wrong."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import deaf_listener, replica  # noqa: F401
from tests.service.helpers import add_nodes, report

NODE = "nv-dgx1"


@pytest.fixture
def dgx1(client: TestClient) -> TestClient:
    add_nodes(client, ("dgx1-v100", NODE))
    return client


def _beat(client: TestClient, nvlink: Any, node: str = NODE) -> Any:
    return client.post(f"/v1/nodes/{node}/heartbeat", json={"nvlink": nvlink})


def _link(gpu: int = 0, link: int = 0, **counters: int) -> dict[str, int]:
    return {"gpu": gpu, "link": link, "tx_bytes": 1 << 40, "rx_bytes": 7, **counters}


def test_the_latest_reading_is_kept_and_read_back(dgx1: TestClient, clock: FakeClock) -> None:
    empty = dgx1.get(f"/v1/nodes/{NODE}/nvlink").json()
    assert empty == {"node": NODE, "at": None, "links": []}
    assert _beat(dgx1, [_link(1, 2, replay_errors=3), _link(0, 5)]).status_code == 204
    view = dgx1.get(f"/v1/nodes/{NODE}/nvlink").json()
    assert view["at"].startswith("2026-06-01T12:00:00")
    assert [(e["gpu"], e["link"]) for e in view["links"]] == [(0, 5), (1, 2)]
    assert view["links"][1]["replay_errors"] == 3 and view["links"][1]["tx_bytes"] == 1 << 40
    assert view["links"][0]["crc_flit_errors"] is None  # not offered by that GPU
    clock.advance(30)
    assert _beat(dgx1, [_link(0, 5, crc_data_errors=1)]).status_code == 204
    latest = dgx1.get(f"/v1/nodes/{NODE}/nvlink").json()["links"]
    assert [(e["gpu"], e["link"], e["crc_data_errors"]) for e in latest] == [(0, 5, 1)]


def test_readings_sent_too_often_are_dropped_and_the_heartbeat_kept(
    dgx1: TestClient, clock: FakeClock
) -> None:
    assert _beat(dgx1, [_link(tx_bytes=1)]).status_code == 204
    clock.advance(9.5)  # under TOPOPLACE_NVLINK_MIN_INTERVAL_S (10 s)
    assert _beat(dgx1, [_link(tx_bytes=2)]).status_code == 204
    assert dgx1.get(f"/v1/nodes/{NODE}/nvlink").json()["links"][0]["tx_bytes"] == 1
    assert dgx1.get(f"/v1/nodes/{NODE}").json()["heartbeat_at"].startswith("2026-06-01T12:00:09")
    clock.advance(0.5)
    assert _beat(dgx1, [_link(tx_bytes=3)]).status_code == 204
    assert dgx1.get(f"/v1/nodes/{NODE}/nvlink").json()["links"][0]["tx_bytes"] == 3
    metrics = dgx1.get("/metrics").text
    assert 'topoplace_nvlink_telemetry_reports_total{outcome="too_soon"} 1.0' in metrics
    assert 'topoplace_nvlink_telemetry_reports_total{outcome="stored"} 2.0' in metrics


@pytest.mark.parametrize(
    ("nvlink", "field"),
    [
        ([_link(gpu=8)], "nvlink.0.gpu"),  # a DGX-1 has GPUs 0-7
        ([_link(), _link(gpu=1), _link(gpu=63)], "nvlink.2.gpu"),
        ([_link(link=36)], "nvlink.0.link"),
        ([_link(tx_bytes=-1)], "nvlink.0.tx_bytes"),
        ([_link(rx_bytes=2**64)], "nvlink.0.rx_bytes"),
        ([{**_link(), "temperature": 3}], "nvlink.0.temperature"),
        ([_link(1, 1), _link(1, 1)], "nvlink"),
        ("all of them", "nvlink"),
        ([_link() | {"tx_bytes": "many"}], "nvlink.0.tx_bytes"),
    ],
)
def test_bad_readings_are_refused_whole(
    dgx1: TestClient, clock: FakeClock, nvlink: Any, field: str
) -> None:
    before = dgx1.get(f"/v1/nodes/{NODE}").json()["heartbeat_at"]
    clock.advance(5)
    refused = _beat(dgx1, nvlink)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["detail"]["field"] == field, error
    assert field.split(".")[-1] in error["message"] or field == "nvlink"
    assert dgx1.get(f"/v1/nodes/{NODE}/nvlink").json()["links"] == []  # nothing kept
    assert dgx1.get(f"/v1/nodes/{NODE}").json()["heartbeat_at"] == before  # nor the beat


def test_a_heartbeat_without_a_body_still_counts(dgx1: TestClient, clock: FakeClock) -> None:
    clock.advance(3)
    assert dgx1.post(f"/v1/nodes/{NODE}/heartbeat").status_code == 204
    assert dgx1.get(f"/v1/nodes/{NODE}").json()["heartbeat_at"].startswith("2026-06-01T12:00:03")


def test_unknown_nodes_are_not_found(dgx1: TestClient) -> None:
    assert dgx1.get("/v1/nodes/nobody/nvlink").json()["error"]["code"] == "not_found"
    assert _beat(dgx1, [_link()], node="nobody").json()["error"]["code"] == "not_found"


def test_a_removed_node_takes_its_reading_with_it(dgx1: TestClient) -> None:
    assert _beat(dgx1, [_link()]).status_code == 204
    assert dgx1.delete(f"/v1/nodes/{NODE}").status_code == 204
    assert f'node="{NODE}"' not in dgx1.get("/metrics").text
    add_nodes(dgx1, ("dgx1-v100", NODE))
    assert dgx1.get(f"/v1/nodes/{NODE}/nvlink").json()["links"] == []


def test_a_viewer_reads_the_counters_and_cannot_send_them(dgx1: TestClient) -> None:
    created = dgx1.post("/v1/tokens", json={"role": "viewer"}).json()
    viewer = {"Authorization": f"Bearer {created['token']}"}
    assert dgx1.get(f"/v1/nodes/{NODE}/nvlink", headers=viewer).status_code == 200
    sent = dgx1.post(f"/v1/nodes/{NODE}/heartbeat", json={"nvlink": []}, headers=viewer)
    assert sent.status_code == 403


@pytest.mark.usefixtures("deaf_listener")
def test_a_replica_behind_judges_gpu_indexes_by_the_stored_snapshot(
    settings: Settings, clock: FakeClock
) -> None:
    """A replica that has not loaded the node's latest snapshot neither refuses a valid
    heartbeat (the node grew from 4 to 8 GPUs) nor keeps counters of GPUs the stored
    snapshot does not have (the node is not in its memory at all)."""
    with replica(settings, clock) as first, replica(settings, clock) as behind:
        add_nodes(first, ("gb200-tray", "nv"))
        assert "nv" not in behind.app.state.service.cluster  # type: ignore[attr-defined]
        refused = _beat(behind, [_link(4)], node="nv")
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["detail"]["field"] == "nvlink.0.gpu"
        behind.app.state.service.sync_nodes(["nv"])  # type: ignore[attr-defined]
        grown = build_profile("hgx-h100", "nv", seq=1)
        assert report(first, grown).status_code == 200
        assert behind.get("/v1/nodes/nv").json()["gpu_count"] == 4  # still behind
        assert _beat(behind, [_link(6)], node="nv").status_code == 204
        assert [e["gpu"] for e in behind.get("/v1/nodes/nv/nvlink").json()["links"]] == [6]
        clock.advance(30)
        assert _beat(behind, [_link(8)], node="nv").status_code == 422
