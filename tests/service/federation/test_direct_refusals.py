"""Federated place and score are served before FastAPI's router (service/direct_routes.py):
their refusals keep the shape FastAPI's validation gives the documented routes."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

JSON = {"Content-Type": "application/json"}
CASES = [
    (b'{"gpus": 0}', {}, "gpus", "Input should be greater than or equal to 1"),
    (b'{"gpus": ', {}, "9", "JSON decode error"),
    (b"", {}, "", "Field required"),
    (b"[1]", {}, "", "Input should be a valid dictionary or object to extract fields from"),
    (
        b'{"gpus": 1}',
        {"Idempotency-Key": "k" * 257},
        "header.idempotency-key",
        "String should have at most 256 characters",
    ),
]


@pytest.mark.parametrize("path", ["/v1/federation/place", "/v1/federation/score"])
@pytest.mark.parametrize(("body", "headers", "field", "message"), CASES)
def test_refusals_name_the_field_as_fastapi_does(
    client: TestClient, path: str, body: bytes, headers: dict[str, str], field: str, message: str
) -> None:
    if path.endswith("score") and headers:
        return  # score takes no Idempotency-Key
    answer = client.post(path, content=body, headers={**JSON, **headers})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["detail"]["field"] == field
    assert error["detail"]["errors"][0]["message"] == message


def test_an_unknown_region_is_refused_through_the_direct_route(client: TestClient) -> None:
    body = b'{"gpus": 1, "federation": {"regions": ["nowhere"]}}'
    answer = client.post("/v1/federation/place", content=body, headers=JSON)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["detail"]["field"] == "federation.regions"


@pytest.mark.parametrize("path", ["/v1/federation/place", "/v1/federation/score"])
@pytest.mark.parametrize("query", ["regions=east", "dry_run=1"])
def test_a_query_parameter_is_refused_as_the_routers_routes_refuse_it(
    client: TestClient, path: str, query: str
) -> None:
    """Served before the router, these routes get the router's check of the query too: a
    parameter they do not take (a filter misspelt as a query) is not dropped."""
    answer = client.post(f"{path}?{query}", content=b'{"gpus": 1}', headers=JSON)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["detail"]["field"] == f"query.{query.split('=')[0]}"
