"""A write body naming a field its model does not have is refused, not read without it:
``{"role": "scheduler", "scope": ["h0"]}`` made a scheduler token for every node."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes


def _refused(response: Any, field: str) -> None:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == field, error


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "scheduler", "scope": ["h0"]}, "scope"),
        ({"role": "agent", "nodes": ["h0"], "regoin": "east"}, "regoin"),
    ],
)
def test_a_token_request_with_an_unknown_field_makes_no_token(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    before = client.get("/v1/tokens").json()["tokens"]
    _refused(client.post("/v1/tokens", json=body), field)
    assert client.get("/v1/tokens").json()["tokens"] == before


def test_extend_key_and_snapshot_bodies_with_unknown_fields_are_refused(
    client: TestClient,
) -> None:
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    placed = client.post("/v1/place", json={"gpus": 1}).json()
    _refused(
        client.post(f"/v1/allocations/{placed['id']}/extend", json={"ttl_s": 60, "confirm": True}),
        "confirm",
    )
    assert client.get(f"/v1/allocations/{placed['id']}").json()["state"] == "pending"
    key = {"algorithm": "ed25519", "public_key": "A" * 43 + "=", "replace": True}
    _refused(client.put("/v1/nodes/h0/key", json=key), "replace")
    assert client.get("/v1/nodes/h0/key").status_code == 404
    newer = snap.model_copy(update={"seq": snap.seq + 1}).model_dump(mode="json")
    _refused(client.put("/v1/nodes/h0/snapshot", json={"snapshot": newer, "sig": "x"}), "sig")
