"""/place and the allocation routes refuse malformed input with 422, reserving nothing."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from placement.request import MAX_NODE_NAMES
from service.settings import Settings
from tests.service.helpers import add_nodes

JSON = {"content-type": "application/json"}


@pytest.fixture
def cluster(client: TestClient) -> TestClient:
    add_nodes(client, ("hgx-h100", "h0"), ("dgx-a100-mig", "m0"))
    return client


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus": True}, "gpus"),
        ({"gpus": "4"}, "gpus"),
        ({"tasks": "2"}, "tasks"),
        ({"gpus": 1, "ttl_s": 1e-300}, "ttl_s"),
        ({"gpus": 1, "ttl_s": 0.05}, "ttl_s"),
        ({"gpus": 1, "ttl_s": "60"}, "ttl_s"),
        ({"mig_profile": ""}, "mig_profile"),
        ({"gpu_models": [""]}, "gpu_models"),
        ({"gpus": 1, "job_id": "j\u0000"}, "job_id"),
        ({"gpus": 1, "owner": "o\u0000"}, "owner"),
        ({"gpus": 1, "cpu_milli": -1}, "cpu_milli"),
        ({"gpus": 1, "cpu_milli": 1.5}, "cpu_milli"),
        ({"gpus": 1, "cpu_milli": "500"}, "cpu_milli"),
        ({"gpus": 1, "memory_mib": -1}, "memory_mib"),
        ({"gpus": 1, "memory_mib": 2.5}, "memory_mib"),
        ({"gpus": 1, "memory_mib": True}, "memory_mib"),
    ],
)
def test_malformed_requests_are_refused_and_reserve_nothing(
    cluster: TestClient, body: dict[str, Any], field: str
) -> None:
    response = cluster.post("/v1/place", json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"].startswith(field)
    assert cluster.get("/v1/allocations").json()["allocations"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [(b'{"gpus": 1, "ttl_s": 1e999}', "ttl_s"), (b'{"gpus": 1, "owner": "o\\ud800"}', "owner")],
)
def test_what_a_client_library_would_not_send_is_refused(
    cluster: TestClient, body: bytes, field: str
) -> None:
    # Infinity, and a lone surrogate (no UTF-8 encoding exists for it), written by hand.
    response = cluster.post("/v1/place", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422 and response.json()["error"]["detail"]["field"] == field


def test_a_ttl_under_the_operators_minimum_is_refused(cluster: TestClient) -> None:
    # 0.5 s is within what any service accepts, under this one's default of 1 s.
    response = cluster.post("/v1/place", json={"gpus": 1, "ttl_s": 0.5})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["detail"]["field"] == "ttl_s"
    assert "TOPOPLACE_MIN_RESERVATION_TTL_S" in response.json()["error"]["message"]
    assert cluster.get("/v1/allocations").json()["allocations"] == []


def test_extend_refuses_a_ttl_that_expires_at_once(cluster: TestClient) -> None:
    placed = cluster.post("/v1/place", json={"gpus": 1}).json()
    for ttl in (1e-300, True, "30"):
        response = cluster.post(f"/v1/allocations/{placed['id']}/extend", json={"ttl_s": ttl})
        assert response.status_code == 422, response.text


def test_node_filter_is_not_a_pattern(cluster: TestClient) -> None:
    cluster.post("/v1/place", json={"gpus": 1, "nodes": ["h0"]})
    assert len(cluster.get("/v1/allocations", params={"node": "h0"}).json()["allocations"]) == 1
    for pattern in ("%", "h_", "_0"):
        listed = cluster.get("/v1/allocations", params={"node": pattern}).json()["allocations"]
        assert listed == [], f"node={pattern!r} matched as a LIKE pattern"


# A list whose every entry costs work per GPU or per node, or is echoed in each node's
# message: 60,000 one-letter GPU models (a 0.4 MB body) held /place for 6 s, on the
# event loop every other request waits on, and 600,000 regions made a /score answer of
# 29 MB for 12 nodes. Each is bounded (placement/request.py) and refused by name.
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("gpu_models", ["zz"] * 65),
        ("regions", [f"r{i}" for i in range(65)]),
        ("node_labels", {f"k{i}": "v" for i in range(65)}),
    ],
)
@pytest.mark.parametrize("route", ["/v1/place", "/v1/score"])
def test_a_list_past_its_bound_is_refused_by_name(
    cluster: TestClient, route: str, field: str, value: object
) -> None:
    response = cluster.post(route, json={"gpus": 1, field: value})
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == field, error
    assert "64" in error["message"], error["message"]
    assert cluster.get("/v1/allocations").json()["allocations"] == []


# An empty label key is a label no node can carry, read before as a filter nothing passes
# (409 "nothing fits"); an empty job id was stored and could not be released by job id.
@pytest.mark.parametrize(
    ("field", "value", "where"),
    [("node_labels", {"": "x"}, "node_labels"), ("job_id", "", "job_id")],
)
@pytest.mark.parametrize("route", ["/v1/place", "/v1/score"])
def test_an_empty_label_key_or_job_id_is_refused_by_name(
    cluster: TestClient, route: str, field: str, value: object, where: str
) -> None:
    response = cluster.post(route, json={"gpus": 1, field: value})
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_request", error
    assert error["detail"]["field"].startswith(where), error
    assert cluster.get("/v1/allocations").json()["allocations"] == []


def test_a_refusal_names_a_long_list_in_a_few_words(cluster: TestClient) -> None:
    """Within the bounds, each node's message still names at most a few of the entries."""
    body = {"gpus": 1, "regions": [f"region-{i:02d}" for i in range(64)]}
    answer = cluster.post("/v1/score", json=body)
    assert answer.status_code == 200, answer.text[:300]
    messages = [n["message"] for n in answer.json()["nodes"]]
    assert messages and all(len(m) < 200 for m in messages), messages
    assert "region-00" in messages[0] and "and 59 more" in messages[0], messages[0]
    refused = cluster.post("/v1/place", json={"gpus": 1, "gpu_models": ["zz"] * 64})
    assert refused.status_code == 422
    assert len(refused.text) < 2000, refused.text


@pytest.mark.parametrize("field", ["cpu_milli", "memory_mib"])
def test_score_refuses_bad_host_figures_by_name(cluster: TestClient, field: str) -> None:
    response = cluster.post("/v1/score", json={"gpus": 1, field: -5})
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == field, error


def _names(count: int) -> list[str]:
    return ["h0"] + [f"n{i}" for i in range(count - 1)]


@pytest.mark.parametrize("field", ["nodes", "exclude_nodes"])
@pytest.mark.parametrize("route", ["/v1/place", "/v1/score"])
def test_a_node_list_past_the_largest_cluster_is_refused(
    cluster: TestClient, route: str, field: str
) -> None:
    response = cluster.post(route, json={"gpus": 1, field: _names(MAX_NODE_NAMES + 1)})
    assert response.status_code == 422, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == field, error
    assert str(MAX_NODE_NAMES) in error["message"], error["message"]
    assert len(response.content) < 2000  # the list is not echoed back
    assert cluster.get("/v1/allocations").json()["allocations"] == []


def test_node_lists_at_the_bound_are_served(cluster: TestClient) -> None:
    names = _names(MAX_NODE_NAMES)
    placed = cluster.post("/v1/place", json={"gpus": 1, "nodes": names, "exclude_nodes": names[1:]})
    assert placed.status_code == 201, placed.text[:300]
    assert placed.json()["tasks"][0]["node"] == "h0"
    page = cluster.post("/v1/score?limit=5", json={"gpus": 1, "nodes": names})
    assert page.status_code == 200, page.text[:300]
    assert page.json()["total"] == MAX_NODE_NAMES


@pytest.mark.parametrize("route", ["/v1/place", "/v1/score"])
def test_a_placement_body_past_its_limit_is_413(
    client: TestClient, settings: Settings, route: str
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    limit = settings.max_placement_body_bytes
    assert limit < settings.max_body_bytes  # other routes keep the general limit

    def padded(size: int) -> bytes:
        head = b'{"gpus": 1'
        return head + b" " * (size - len(head) - 1) + b"}"

    over = client.post(route, content=padded(limit + 1), headers=JSON)
    assert over.status_code == 413, over.text[:300]
    error = over.json()["error"]
    assert error["code"] == "payload_too_large" and error["detail"]["limit"] == limit
    assert "TOPOPLACE_MAX_PLACEMENT_BODY_BYTES" in error["message"], error["message"]
    assert client.get("/v1/allocations").json()["allocations"] == []
    at = client.post(route, content=padded(limit), headers=JSON)
    assert at.status_code in (200, 201), at.text[:300]


def test_the_placement_body_limit_holds_below_a_root_path(client: TestClient) -> None:
    # Behind a proxy that mounts the service at /api, /api/v1/place is /v1/place.
    limit = client.app.state.service.settings.max_placement_body_bytes  # type: ignore[attr-defined]
    body = b'{"gpus": 1' + b" " * limit + b"}"
    with TestClient(client.app, root_path="/api", headers=dict(client.headers)) as mounted:
        over = mounted.post("/api/v1/place", content=body, headers=JSON)
    assert over.status_code == 413, over.text[:300]
    assert "TOPOPLACE_MAX_PLACEMENT_BODY_BYTES" in over.json()["error"]["message"]


@pytest.mark.parametrize("field", ["gpus", "cpu_milli", "memory_mib"])
def test_a_number_too_long_to_read_is_malformed_json(cluster: TestClient, field: str) -> None:
    # Python refuses to read an integer of more than 4,300 digits (a quadratic conversion);
    # the body is then malformed JSON like any other, not a parse failure of unknown kind.
    body = b'{"gpus": 1, "%s": 1%s}' % (field.encode(), b"0" * 5000)
    for route in ("/v1/place", "/v1/score"):
        response = cluster.post(route, content=body, headers=JSON)
        assert response.status_code == 422, response.text[:300]
        error = response.json()["error"]
        assert error["code"] == "invalid_request" and error["detail"]["field"] == "body", error
        assert "digits" in error["message"], error["message"]
    assert cluster.get("/v1/allocations").json()["allocations"] == []
