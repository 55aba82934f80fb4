"""A REST /place without an Idempotency-Key whose client hung up before its answer keeps
no reservation: the client cannot learn it, and its retry would reserve a second one."""

from __future__ import annotations

import json

from fastapi.testclient import TestClient
from starlette.types import Message

from placement.profiles import build_profile
from tests.service.conftest import ADMIN_TOKEN
from tests.service.helpers import report


def _place_then_hang_up(rest: TestClient, body: dict[str, object], key: str | None) -> None:
    """The request as uvicorn hands it over from a client gone before the answer: the
    body, then the disconnect."""
    encoded = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"host", b"testserver"),
        (b"authorization", f"Bearer {ADMIN_TOKEN}".encode()),
    ]
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/place",
        "raw_path": b"/v1/place",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": encoded, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        return None  # nobody to answer

    async def call() -> None:
        await rest.app(scope, receive, send)  # type: ignore[arg-type]

    assert rest.portal is not None
    rest.portal.call(call)


def _states(client: TestClient, job_id: str) -> list[str]:
    listed = client.get("/v1/allocations", params={"job_id": job_id}).json()["allocations"]
    return [a["state"] for a in listed]


def test_a_keyless_place_whose_client_hung_up_keeps_nothing(client: TestClient) -> None:
    report(client, build_profile("hgx-h100", "h0"))
    _place_then_hang_up(client, {"gpus": 2, "job_id": "gone"}, None)
    assert _states(client, "gone") == ["released"]
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 8


def test_a_keyed_place_whose_client_hung_up_is_kept_for_its_retry(client: TestClient) -> None:
    report(client, build_profile("hgx-h100", "h0"))
    _place_then_hang_up(client, {"gpus": 2, "job_id": "keyed"}, "k-1")
    assert _states(client, "keyed") == ["pending"]
    retry = client.post(
        "/v1/place", json={"gpus": 2, "job_id": "keyed"}, headers={"Idempotency-Key": "k-1"}
    )
    assert retry.status_code == 200, retry.text
    assert _states(client, "keyed") == ["pending"]


def test_an_answered_place_is_kept(client: TestClient) -> None:
    report(client, build_profile("hgx-h100", "h0"))
    assert client.post("/v1/place", json={"gpus": 2, "job_id": "kept"}).status_code == 201
    assert _states(client, "kept") == ["pending"]
