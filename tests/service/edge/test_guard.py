"""The request guard: URL, header and body checks made before any route reads the request."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.types import Message, Receive, Scope, Send

from service.edge.guard import MAX_URL_BYTES, RequestGuard
from service.edge.json_scan import MAX_DEPTH
from tests.service.helpers import add_nodes


def _scope(headers: list[tuple[bytes, bytes]] | None = None) -> Scope:
    return {
        "type": "http",
        "method": "POST",
        "path": "/v1/place",
        "raw_path": b"/v1/place",
        "query_string": b"",
        "headers": headers or [],
    }


async def _run(guard: RequestGuard, scope: Scope, receive: Receive) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await guard(scope, receive, send)
    return sent


async def _never_called(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("the application must not see an oversized body")


@pytest.mark.anyio
async def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit() -> None:
    chunks_read = 0

    async def receive() -> Message:
        nonlocal chunks_read
        chunks_read += 1
        return {"type": "http.request", "body": b"x" * 100, "more_body": True}  # endless

    sent = await _run(RequestGuard(_never_called, max_body_bytes=1000), _scope(), receive)
    assert sent[0]["status"] == 413
    assert chunks_read == 11  # 1,100 bytes: the first chunk past the limit, no more
    body = json.loads(sent[1]["body"])
    assert body["error"]["code"] == "payload_too_large"


@pytest.mark.anyio
async def test_the_application_reads_the_body_as_sent() -> None:
    seen: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        seen.append(message["body"])
        assert not message["more_body"]

    parts = iter([b'{"gpus"', b": 2}"])

    async def receive() -> Message:
        part = next(parts)
        return {"type": "http.request", "body": part, "more_body": part != b": 2}"}

    await _run(RequestGuard(app, max_body_bytes=1000), _scope(), receive)
    assert seen == [b'{"gpus": 2}']


def _error(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == code and set(error) == {"code", "message", "detail"}
    return error


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1/jobs/%00/release"),
        ("POST", "/v1/nodes/%00/heartbeat"),
        ("GET", "/v1/allocations/%00"),
        ("GET", "/v1/nodes/a%0Ab"),
        ("GET", "/v1/allocations?job_id=%00"),
        ("GET", "/v1/allocations?node=n%1B"),
        ("GET", "/v1/allocations?st%00ate=active"),
    ],
)
def test_control_characters_in_path_or_query_are_refused(
    client: TestClient, method: str, path: str
) -> None:
    error = _error(client.request(method, path), 422, "invalid_request")
    assert error["detail"]["field"] in {"path", "query"}


def test_deeply_nested_json_is_refused_in_the_error_shape(client: TestClient) -> None:
    for depth in (MAX_DEPTH + 1, 100_000):
        body = b"[" * depth + b"]" * depth
        response = client.post(
            "/v1/place", content=body, headers={"content-type": "application/json"}
        )
        _error(response, 422, "invalid_request")
    # Brackets inside strings are text, not nesting.
    response = client.post("/v1/place", json={"job_id": "[" * 200})
    assert response.status_code != 422 or "nested" not in response.text


def test_an_over_long_url_is_refused_in_the_error_shape(client: TestClient) -> None:
    _error(client.get("/v1/allocations?job_id=" + "j" * MAX_URL_BYTES), 414, "uri_too_long")


def test_idempotency_keys_must_be_plain_and_not_empty(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    error = _error(
        client.post("/v1/place", json={"gpus": 1}, headers={"Idempotency-Key": ""}),
        422,
        "invalid_request",
    )
    assert "idempotency-key" in error["detail"]["field"]
    response = client.post("/v1/place", json={"gpus": 1}, headers={"Idempotency-Key": "a\x01b"})
    _error(response, 422, "invalid_request")
    assert client.get("/v1/allocations").json()["allocations"] == []


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/no-such-route", 404, "not_found"),
        ("DELETE", "/v1/place", 405, "method_not_allowed"),
    ],
)
def test_unknown_routes_and_methods_answer_in_the_error_shape(
    client: TestClient, method: str, path: str, status: int, code: str
) -> None:
    response = client.request(method, path)
    _error(response, status, code)
    if status == 405:
        assert response.headers["allow"] == "POST"


def test_malformed_json_answers_in_the_error_shape(client: TestClient) -> None:
    response = client.post(
        "/v1/place", content=b'{"gpus": ', headers={"content-type": "application/json"}
    )
    _error(response, 422, "invalid_request")


def test_an_idempotency_key_given_twice_is_refused(client: TestClient) -> None:
    """Two keys on one request: it was keyed by the first, so its retry through a proxy
    that joins them ("a, b") or keeps the other made a second reservation."""
    add_nodes(client, ("hgx-h100", "h0"))
    both = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    response = client.post("/v1/place", json={"gpus": 1}, headers=both)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["detail"]["field"] == "header.idempotency-key"
    assert client.get("/v1/allocations").json()["allocations"] == []
