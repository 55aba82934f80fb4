"""A query parameter a route does not take, or one it takes given twice, is refused:
a misspelt filter (``?jobid=``) answered every allocation, not the job's."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes


def _refused(response: httpx.Response, field: str) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == field
    return error


def test_a_misspelt_filter_is_refused_not_ignored(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    for job in ("a", "b"):
        assert client.post("/v1/place", json={"gpus": 1, "job_id": job}).status_code == 201
    error = _refused(client.get("/v1/allocations?jobid=a"), "query.jobid")
    # The message names what the route takes, so the caller can correct it.
    assert "job_id" in str(error["message"]) and "limit" in str(error["message"])
    listed = client.get("/v1/allocations?job_id=a").json()["allocations"]
    assert [a["job_id"] for a in listed] == ["a"]


def test_a_parameter_given_twice_is_refused(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    _refused(client.get("/v1/allocations?job_id=a&job_id=b"), "query.job_id")
    _refused(client.get("/v1/allocations?limit=1&limit=2"), "query.limit")


def test_a_write_with_an_unknown_parameter_changes_nothing(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    placed = client.post("/v1/place", json={"gpus": 1}).json()
    _refused(client.post(f"/v1/allocations/{placed['id']}/release?force=true"), "query.force")
    assert client.get(f"/v1/allocations/{placed['id']}").json()["state"] == "pending"
    _refused(client.post("/v1/place?dry_run=1", json={"gpus": 1}), "query.dry_run")
    assert len(client.get("/v1/allocations").json()["allocations"]) == 1


def test_declared_parameters_still_serve(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    assert client.get("/v1/allocations?state=pending&limit=5&node=h0&job_id=x").status_code == 200
    assert client.post("/v1/score?limit=1&offset=0", json={"gpus": 1}).status_code == 200
    assert client.get("/v1/audit?limit=1").status_code == 200
    assert client.get("/v1/nodes").status_code == 200
