"""The device plugin's routes take its node's agent token, and only for that node."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.k8s.settings import ExtenderSettings
from tests.service.test_access_scope import ADMIN, bearer, new_token, snapshot_body, trusting


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(trusting(tmp_path / "plugin.sqlite3"), background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    with TestClient(app) as c:
        yield c


def test_an_agent_token_reads_and_reports_its_own_node_only(client: TestClient) -> None:
    for name in ("node-a", "node-b"):
        answer = client.put(f"/v1/nodes/{name}/snapshot", json=snapshot_body(name), headers=ADMIN)
        assert answer.status_code == 200, answer.text
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))
    report = {"resource": "nvidia.com/gpu", "pods": []}

    mine = client.get("/v1/nodes/node-a/k8s/reservations", headers=agent)
    assert mine.status_code == 200, mine.text
    assert mine.json() == {"node": "node-a", "reservations": []}
    assert (
        client.post("/v1/nodes/node-a/k8s/devices", json=report, headers=agent).status_code == 200
    )

    refused = [
        client.get("/v1/nodes/node-b/k8s/reservations", headers=agent),
        client.post("/v1/nodes/node-b/k8s/devices", json=report, headers=agent),
        client.get("/v1/k8s/mismatches", headers=agent),  # a read: viewers and up
    ]
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "forbidden"
    assert client.get("/v1/nodes/node-a/k8s/reservations").status_code == 401
    viewer = bearer(new_token(client, role="viewer"))
    assert client.get("/v1/k8s/mismatches", headers=viewer).status_code == 200
