"""An answer of declared length leaves in one write; a stream's head is not held.

Driven through `topoplace serve`'s own HTTP protocol with a transport that
records each write, as uvicorn's own protocol tests do: on loopback two
writes usually arrive together, so only the writes themselves tell.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.server import ServerState

from topoplace.serve_cmd import header_deadline_protocol


class Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def pause_reading(self) -> None:
        return

    def resume_reading(self) -> None:
        return


async def _served(app: Any, request: bytes, until: asyncio.Event | None = None) -> Recording:
    config = uvicorn.Config(app, http=header_deadline_protocol(5.0), log_level="warning")
    config.load()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=ServerState(), app_state={}
    )
    transport = Recording()
    protocol.connection_made(transport)
    protocol.data_received(request)
    for _ in range(20):  # the request's task runs on the loop
        await asyncio.sleep(0)
        if until is not None and until.is_set():
            break
    return transport


async def _sized(scope: Scope, receive: Receive, send: Send) -> None:
    body = b'{"status":"ok"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def test_an_answer_of_declared_length_is_one_write() -> None:
    async def run() -> Recording:
        return await _served(_sized, b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")

    transport = asyncio.run(run())
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"content-length: 15" in head
    assert body == b'{"status":"ok"}'


def test_two_answers_on_one_connection_are_one_write_each() -> None:
    request = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"
    transport = asyncio.run(_served(_sized, request * 2))  # the second one pipelined
    assert len(transport.writes) == 2
    assert all(w.endswith(b'\r\n\r\n{"status":"ok"}') for w in transport.writes)


def test_a_head_request_is_one_write_with_no_body() -> None:
    transport = asyncio.run(_served(_sized, b"HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n"))
    assert len(transport.writes) == 1
    assert transport.writes[0].endswith(b"\r\n\r\n")


def test_a_streamed_answer_sends_its_head_before_its_first_chunk() -> None:
    first_chunk_due = asyncio.Event()
    head_seen: list[list[bytes]] = []

    async def streamed(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        head_seen.append(list(transport_writes))  # what the client has before any chunk
        first_chunk_due.set()
        await send({"type": "http.response.body", "body": b"a", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    transport_writes: list[bytes] = []

    async def run() -> Recording:
        transport = Recording()
        transport.writes = transport_writes
        config = uvicorn.Config(streamed, http=header_deadline_protocol(5.0), log_level="warning")
        config.load()
        protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}
        )
        protocol.connection_made(transport)
        protocol.data_received(b"GET /s HTTP/1.1\r\nHost: t\r\n\r\n")
        for _ in range(20):
            await asyncio.sleep(0)
        return transport

    transport = asyncio.run(run())
    assert first_chunk_due.is_set()
    assert len(head_seen[0]) == 1 and b"transfer-encoding: chunked" in head_seen[0][0]
    assert b"".join(transport.writes).endswith(b"1\r\na\r\n0\r\n\r\n")


def test_an_answer_whose_app_fails_after_its_head_closes_the_connection() -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-length", b"10")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        raise RuntimeError("fault after the head")

    transport = asyncio.run(_served(broken, b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"))
    assert transport.closed
    assert transport.writes == []  # the held head of a broken answer is never sent
