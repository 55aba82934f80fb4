"""A region's forward token is sent as a bearer token in a header: visible ASCII only.

One with a character past ASCII (``tøken``) was registered, and every forward
to its region then raised out of routing: a 500 for every job that ranked the
region first, though other regions could take it, and for every retry of a
key pointed there, nothing ever sent. Refused where it is set now; one
stored before is a forward not sent, as for a region not reached.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.schema import regions as regions_table
from tests.service.federation.fake_regions import KEY, Regions

NOT_A_HEADER = ["t\u00f8ken", "tok\u20acn", "tok en"]


@pytest.mark.parametrize("token", NOT_A_HEADER)
def test_a_forward_token_not_visible_ascii_is_refused(
    client: TestClient, regions: Regions, token: str
) -> None:
    registration = {
        "name": "other",
        "cloud": "aws",
        "url": "http://other.example",
        "public_key": KEY.public_key,
        "forward_token": token,
        "prices": [{"gpu_model": "H100", "on_demand": 1.0}],
        "egress": {"region_gb": 0.0, "internet_gb": 0.0},
    }
    created = client.post("/v1/regions", json=registration)
    assert created.status_code == 422, created.text
    assert created.json()["error"]["code"] == "invalid_request"
    assert "forward_token" in created.text
    updated = client.patch("/v1/regions/cheap", json={"forward_token": token})
    assert updated.status_code == 422, updated.text
    assert updated.json()["error"]["code"] == "invalid_request"
    assert "forward_token" in updated.text


def stored_token(client: TestClient, region: str, token: str) -> None:
    """A token stored before it was checked, read by the replica."""
    app: Any = client.app
    registry = app.state.federation
    with registry.engine.begin() as conn:
        table = regions_table
        conn.execute(table.update().where(table.c.name == region).values(forward_token=token))
    registry.invalidate()


def test_a_stored_token_past_ascii_is_a_forward_not_sent(
    client: TestClient, regions: Regions
) -> None:
    stored_token(client, "cheap", "t\u00f8ken")
    for key in (None, "k-token"):
        headers = {"Idempotency-Key": key} if key else {}
        answer = client.post("/v1/federation/place", json={"gpus": 2}, headers=headers)
        assert answer.status_code == 201, answer.text
        body = answer.json()
        assert body["region"] == "mid"
        assert body["attempts"][0]["outcome"] == "unreachable"
        assert "forward_token" in body["attempts"][0]["detail"]
    assert [r for r, _, _ in regions.seen] == ["mid", "mid"]


def test_a_key_pinned_where_the_token_is_stored_past_ascii_stays_there(
    client: TestClient, regions: Regions
) -> None:
    """The key's region may hold its allocation: it stays there, 503, not a 500."""
    assert (
        client.post(
            "/v1/federation/place", json={"gpus": 2}, headers={"Idempotency-Key": "k-pin"}
        ).json()["region"]
        == "cheap"
    )
    stored_token(client, "cheap", "t\u00f8ken")
    again = client.post(
        "/v1/federation/place", json={"gpus": 2}, headers={"Idempotency-Key": "k-pin"}
    )
    assert again.status_code == 503, again.text
    assert again.json()["error"]["code"] == "region_unavailable"
    assert [r for r, _, _ in regions.seen] == ["cheap"]
