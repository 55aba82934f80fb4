"""Connection: close on an answer sent before its request's body was all received."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive, Scope, Send

from service.edge.unread_body import CloseUnreadBody


async def _answer(scope: Scope, receive: Receive, send: Send) -> None:
    if scope["path"] == "/reads":
        while (await receive()).get("more_body", False):
            pass
    await send({"type": "http.response.start", "status": 200, "headers": [(b"x-a", b"1")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _headers(path: str, request_headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    chunks = [
        {"type": "http.request", "body": b"{", "more_body": True},
        {"type": "http.request", "body": b"}", "more_body": False},
    ]
    sent: list[Message] = []

    async def receive() -> Message:
        return chunks.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "method": "POST", "headers": request_headers}
    asyncio.run(CloseUnreadBody(_answer)(scope, receive, send))
    return list(sent[0]["headers"])


@pytest.mark.parametrize(
    "declared", [[(b"content-length", b"2")], [(b"transfer-encoding", b"chunked")]]
)
def test_an_answer_before_the_body_ended_closes_the_connection(
    declared: list[tuple[bytes, bytes]],
) -> None:
    assert _headers("/ignores", declared) == [(b"x-a", b"1"), (b"connection", b"close")]


def test_a_body_read_to_its_end_or_none_keeps_the_connection() -> None:
    assert _headers("/reads", [(b"content-length", b"2")]) == [(b"x-a", b"1")]
    assert _headers("/ignores", [(b"content-length", b"0")]) == [(b"x-a", b"1")]
    assert _headers("/ignores", []) == [(b"x-a", b"1")]
