"""Snapshots the engine could not load, or the database could not hold, are refused first."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from placement.profiles import build_profile


def _put(client: TestClient, name: str, snapshot: dict[str, Any]) -> Any:
    return client.put(f"/v1/nodes/{name}/snapshot", json={"snapshot": snapshot})


@pytest.mark.parametrize(
    "change",
    [
        {"gpus": [], "links": [], "nics": [], "cpu_links": [], "mig_instances": []},
        {"seq": 2**63},
        {"seq": True},
        {"seq": "3"},
        {"hostname": "h0\u0000"},
        {"labels": {"topoplace.io/rack": "rack1\n"}},
    ],
)
def test_refused_before_anything_is_stored(client: TestClient, change: dict[str, Any]) -> None:
    snapshot = {**build_profile("hgx-h100", "h0").model_dump(mode="json"), **change}
    response = _put(client, "h0", snapshot)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert client.get("/v1/nodes").json()["nodes"] == []


def test_the_largest_seq_a_bigint_holds_is_accepted(client: TestClient) -> None:
    snapshot = {**build_profile("hgx-h100", "h0").model_dump(mode="json"), "seq": 2**63 - 1}
    assert _put(client, "h0", snapshot).status_code == 200


def test_a_node_key_name_must_be_plain(client: TestClient) -> None:
    response = client.put("/v1/nodes/n%00/key", json={"public_key": "A" * 43 + "="})
    assert response.status_code == 422


def test_a_gpu_uuid_carrying_a_comma_is_refused_naming_it(client: TestClient) -> None:
    """A UUID is joined with commas into the devices a job sees: "GPU-x,<GPU 1's UUID>"
    as GPU 0 would show GPU 1 to the job given GPU 0 and to the job given GPU 1."""
    snapshot = build_profile("hgx-h100", "h0").model_dump(mode="json")
    snapshot["gpus"][0]["uuid"] = "GPU-x," + snapshot["gpus"][1]["uuid"]
    response = _put(client, "h0", snapshot)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "gpus.0.uuid" in response.text
    assert client.get("/v1/nodes").json()["nodes"] == []
