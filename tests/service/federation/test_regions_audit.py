"""Regions in the audit log: register and retire are admin rows; refused summaries leave one."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from agent.signing import NodeKey
from tests.service.federation.test_regions_api import bearer, register, signed, summary


def _audit(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/v1/audit", params=params)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


def test_register_and_retire_are_admin_rows_naming_the_admin(client: TestClient) -> None:
    register(client)
    retired = client.post("/v1/regions/aws-east/retire")
    assert retired.status_code == 200, retired.text
    again = client.post("/v1/regions/aws-east/retire")  # already retired: nothing, no row
    assert again.status_code == 200
    rows = _audit(client, kind="admin")
    # The region token is made and revoked with the region, in the same transaction.
    assert [r["action"] for r in rows] == [
        "region_retired",
        "token_revoked",
        "region_registered",
        "token_created",
    ]
    assert {r["route"] for r in rows} == {
        "POST /v1/regions/{region}/retire",
        "POST /v1/regions",
    }
    assert all(r["actor"]["role"] == "admin" for r in rows)
    assert rows[2]["detail"]["region"] == "aws-east" and rows[2]["detail"]["cloud"] == "aws"
    assert rows[0]["detail"]["token_id"] == rows[2]["detail"]["token_id"]


def test_refused_summaries_are_recorded_and_the_taken_one_is_not(client: TestClient) -> None:
    token = register(client)
    body = summary()
    url = "/v1/regions/aws-east/summary"
    assert client.put(url, json=signed(body), headers=bearer(token)).status_code == 200
    assert client.put(url, json=signed(body), headers=bearer(token)).status_code == 409
    forged = signed(summary(), NodeKey.generate())
    assert client.put(url, json=forged, headers=bearer(token)).status_code == 403
    rows = _audit(client, kind="summary")
    assert [r["action"] for r in rows] == ["bad_signature", "replayed_summary"]
    assert rows[1]["detail"]["seq"] == body["seq"] and rows[1]["detail"]["region"] == "aws-east"
    assert rows[0]["actor"]["role"] == "region" and rows[0]["route"] == "PUT " + url.replace(
        "aws-east", "{region}"
    )
