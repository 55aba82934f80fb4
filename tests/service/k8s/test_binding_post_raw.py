"""The Binding POST against API servers written on raw sockets: answers in many
segments with no declared length, and a kept connection reset (RST) while idle.

Each case runs both ways a bind posts, as in test_binding_post.py.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from service.k8s.kube_api import HttpKubeApi, KubeApiError
from tests.service.k8s.test_binding_post import MODES

# answer(connection, n, request) writes the n-th answer; False ends the connection.
Answerer = Callable[[socket.socket, int, bytes], bool]


def _read_request(conn: socket.socket, buf: bytearray) -> bytes | None:
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        rest += conn.recv(65536)
    buf[:] = rest[length:]
    return head + b"\r\n\r\n" + rest[:length]


@contextmanager
def _raw_server(answer: Answerer) -> Iterator[tuple[str, list[bytes]]]:
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[bytes] = []

    def serve(conn: socket.socket) -> None:
        buf = bytearray()
        with conn:
            try:
                while (request := _read_request(conn, buf)) is not None:
                    seen.append(request)
                    if not answer(conn, len(seen), request):
                        return
            except OSError:
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", seen
    finally:
        listener.close()


def _binds(client: HttpKubeApi, mode: str, count: int, pause_s: float = 0.0) -> list[object]:
    """``count`` binds in order, ``pause_s`` apart; what each raised (None: bound)."""
    out: list[object] = []
    if mode == "thread":
        for i in range(count):
            time.sleep(pause_s if i else 0)
            try:
                client.bind("ml", f"p{i}", "", "n1", {})
                out.append(None)
            except KubeApiError as exc:
                out.append(exc)
        return out

    async def run() -> None:
        for i in range(count):
            await asyncio.sleep(pause_s if i else 0)
            try:
                await client.bind_async("ml", f"p{i}", "", "n1", {})
                out.append(None)
            except KubeApiError as exc:
                out.append(exc)

    asyncio.run(run())
    return out


MESSAGE = 'pods "p0" is forbidden: User "system:serviceaccount:x:y" cannot create' + " x" * 200
FORBIDDEN = json.dumps({"kind": "Status", "status": "Failure", "message": MESSAGE, "code": 403})


@pytest.mark.parametrize("mode", MODES)
def test_an_answer_without_a_length_is_read_to_the_end_of_the_connection(mode: str) -> None:
    """HTTP/1.0, no Content-Length, the body in 40-byte segments: the refusal's message
    whole, not its first segment."""

    def answer(conn: socket.socket, _n: int, _request: bytes) -> bool:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"HTTP/1.0 403 Forbidden\r\nContent-Type: application/json\r\n\r\n")
        body = FORBIDDEN.encode()
        for i in range(0, len(body), 40):
            conn.sendall(body[i : i + 40])
            time.sleep(0.005)
        return False

    with _raw_server(answer) as (url, _):
        (refused,) = _binds(HttpKubeApi(url, timeout_s=2), mode, 1)
    assert isinstance(refused, KubeApiError)
    assert (refused.status, refused.message) == (403, MESSAGE)


@pytest.mark.parametrize("mode", MODES)
def test_a_kept_connection_reset_while_idle_is_replaced(mode: str) -> None:
    """The server answers keep-alive, then resets the idle connection (RST, not FIN): the
    next bind goes out again on a new connection and is made."""

    def answer(conn: socket.socket, n: int, _request: bytes) -> bool:
        body = b'{"kind":"Status","status":"Success","code":201}'
        conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        if n == 1:
            time.sleep(0.05)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False  # closed with SO_LINGER 0: a reset
        return True

    with _raw_server(answer) as (url, seen):
        outcomes = _binds(HttpKubeApi(url, timeout_s=2), mode, 2, pause_s=0.2)
    assert outcomes == [None, None]
    assert len(seen) == 2
