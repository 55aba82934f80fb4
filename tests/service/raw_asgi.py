"""A POST handed to the application as uvicorn hands it over, for what a test client
cannot send: a query with a '#' in it (h11 passes one on), a Host header's bytes as sent
(the test client re-encodes them), a client gone before its answer (the body, then the
disconnect)."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from starlette.types import Message


def raw_post(
    client: TestClient,
    path: str,
    body: Any,
    headers: list[tuple[bytes, bytes]],
    query: bytes = b"",
    host: bytes = b"testserver",
) -> tuple[int | None, bytes]:
    """POST ``body`` as JSON to ``client``'s application; then the client is gone. The
    answer's status and body (None and nothing if none was sent). ``host``: the ``Host``
    header's bytes, as the server passes them on (h11 lets any byte past 0x7F through)."""
    encoded = json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query,
        "headers": [
            (b"host", host),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(encoded)).encode()),
            *headers,
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    sent = False
    answer: dict[str, Any] = {"status": None, "body": b""}

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": encoded, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer["status"] = message["status"]
        elif message["type"] == "http.response.body":
            answer["body"] += message.get("body", b"")

    async def call() -> None:
        await client.app(scope, receive, send)

    assert client.portal is not None
    client.portal.call(call)
    return answer["status"], answer["body"]
