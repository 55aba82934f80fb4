"""A stored node the engine cannot load is skipped, named in an ERROR line; the service runs.

Such rows come from before snapshots were checked as the engine loads them
(or from a hand-edited database): written here straight into the table.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service import migrate, schema
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import FakeClock

NO_GPUS = '{"name":"nogpu","gpus":[],"links":[]}'


def _store_rows(settings: Settings, rows: dict[str, tuple[int, str]]) -> None:
    migrate.upgrade(settings.database_url)
    engine = sa.create_engine(settings.database_url)
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    with engine.begin() as conn:
        for name, (seq, body) in rows.items():
            conn.execute(
                sa.insert(schema.nodes).values(
                    name=name,
                    region="default",
                    snapshot=body,
                    seq=seq,
                    cordoned=False,
                    reported_at=now,
                    heartbeat_at=now,
                )
            )
    engine.dispose()


def _errors_naming(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and f"node {name} " in r.getMessage()
    ]


def test_the_service_starts_without_the_nodes_it_cannot_load(
    settings: Settings, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    good = build_profile("hgx-h100", "good")
    _store_rows(
        settings,
        {
            "good": (0, good.model_dump_json()),
            "nogpu": (3, NO_GPUS),
            "garbled": (4, "{not json"),
        },
    )
    caplog.set_level(logging.ERROR, logger="topoplace.state")
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        ready = client.get("/readyz").json()
        assert (ready["status"], ready["nodes"]) == ("ready", 1)
        assert [n["name"] for n in client.get("/v1/nodes").json()["nodes"]] == ["good"]
        assert client.get("/v1/nodes/nogpu").status_code == 404
        placed = client.post("/v1/place", json={"gpus": 2})
        assert placed.status_code == 201 and placed.json()["tasks"][0]["node"] == "good"
        # The node's agent can repair it with a good snapshot of a later seq.
        repaired = build_profile("hgx-b200", "nogpu", seq=5).model_dump(mode="json")
        answer = client.put("/v1/nodes/nogpu/snapshot", json={"snapshot": repaired})
        assert answer.status_code == 200, answer.text
        assert client.get("/v1/nodes/nogpu").json()["gpu_count"] == 8
    # At start, and on Postgres again when the notification listener starts and syncs.
    no_gpus = _errors_naming(caplog, "nogpu")
    assert no_gpus and all("seq 3" in line and "cannot be loaded" in line for line in no_gpus)
    garbled = _errors_naming(caplog, "garbled")
    assert garbled and all("JSONDecodeError" in line for line in garbled)


def test_a_bad_row_seen_by_a_sync_is_skipped_too(
    client: TestClient, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Another replica (or an old version) stored it: this replica's sync goes on."""
    good = build_profile("hgx-h100", "good")
    answer = client.put("/v1/nodes/good/snapshot", json={"snapshot": good.model_dump(mode="json")})
    assert answer.status_code == 200
    _store_rows(settings, {"nogpu": (1, NO_GPUS)})
    state = client.app.state.service  # type: ignore[attr-defined]
    caplog.set_level(logging.ERROR, logger="topoplace.state")
    state.sync_nodes(["nogpu", "good"])
    state.resync()
    assert state.cluster.names() == ["good"]
    assert len(_errors_naming(caplog, "nogpu")) == 2  # once per sync that met it
    assert client.post("/v1/place", json={"gpus": 8}).status_code == 201


def test_a_cordon_of_a_node_it_cannot_load_writes_nothing(
    client: TestClient, settings: Settings
) -> None:
    """The node is unknown to the API (404), so its cordon is refused before anything is
    written: no cordoned row left for the node to come back with once it is repaired, and
    no audit line saying it was cordoned."""
    _store_rows(settings, {"nogpu": (1, NO_GPUS)})
    answer = client.post("/v1/nodes/nogpu/cordon")
    assert answer.status_code == 404, answer.text
    assert answer.json()["error"]["code"] == "not_found"
    engine = sa.create_engine(settings.database_url)
    with engine.connect() as conn:
        cordoned = conn.execute(
            sa.select(schema.nodes.c.cordoned).where(schema.nodes.c.name == "nogpu")
        ).scalar_one()
        actions = conn.execute(sa.select(schema.audit_log.c.action)).scalars().all()
    engine.dispose()
    assert not cordoned
    assert "node_cordoned" not in actions
    repaired = build_profile("hgx-b200", "nogpu", seq=5).model_dump(mode="json")
    assert client.put("/v1/nodes/nogpu/snapshot", json={"snapshot": repaired}).status_code == 200
    assert client.get("/v1/nodes/nogpu").json()["state"] == "ready"


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", NO_GPUS])
def test_counters_sent_for_a_node_it_cannot_load_are_refused(
    client: TestClient, settings: Settings, body: str
) -> None:
    """Memory lacks such a node, so its heartbeat's NVLink counters are judged by the
    stored row: one that is no JSON object was a 500 (internal_error) at every beat."""
    _store_rows(settings, {"bad": (1, body)})
    link = {"gpu": 0, "link": 0, "tx_bytes": 1}
    answer = client.post("/v1/nodes/bad/heartbeat", json={"nvlink": [link]})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["detail"]["field"] == "nvlink.0.gpu"
    assert "has no GPU the service can read" in error["message"], error
    assert client.post("/v1/nodes/bad/heartbeat").status_code == 204


@pytest.mark.parametrize("body", ["{not json", "[1, 2]", '"x"'])
def test_a_row_that_is_no_json_object_is_repaired_by_a_later_snapshot(
    client: TestClient, settings: Settings, body: str
) -> None:
    """As a node the engine cannot load is: the report compared the row with the new
    snapshot as JSON objects, and every report of such a node was a 500."""
    _store_rows(settings, {"bad": (1, body)})
    repaired = build_profile("hgx-b200", "bad", seq=5).model_dump(mode="json")
    answer = client.put("/v1/nodes/bad/snapshot", json={"snapshot": repaired})
    assert answer.status_code == 200, answer.text
    assert answer.json()["changed"] is True
    assert client.get("/v1/nodes/bad").json()["gpu_count"] == 8
