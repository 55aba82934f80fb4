"""A client that reads nothing of its answer is cut off; one that reads slowly is not.

Through `topoplace serve`'s own HTTP protocol on a real uvicorn over loopback.
An answer larger than the kernel's buffers (4 MiB on loopback) is left in the
process until the client reads it: before, a client that never read held it,
and the application's last write, for as long as it stayed connected.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest
from fastapi import FastAPI, Response

from tests.live_server import live_server
from topoplace.serve_cmd import header_deadline_protocol

STALL_S = 0.5
SIZE = 32 * 2**20  # well over what the kernel buffers on loopback


LOST = threading.Event()


def _watched(protocol: type) -> type:
    """The protocol, telling when a connection of a /big request ends."""

    class Watched(protocol):  # type: ignore[misc, valid-type]
        big = False

        def data_received(self, data: bytes) -> None:
            self.big = self.big or data.startswith(b"GET /big")
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self.big:
                LOST.set()
            super().connection_lost(exc)

    return Watched


@pytest.fixture
def address() -> Iterator[tuple[str, int]]:
    app = FastAPI()

    @app.get("/readyz")
    def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.get("/big")
    def big(size: int = SIZE) -> Response:
        return Response(b"x" * size, media_type="application/octet-stream")

    with live_server(
        app, options={"http": _watched(header_deadline_protocol(5.0, STALL_S))}
    ) as url:
        LOST.clear()
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(1 << 20):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def test_a_client_that_reads_nothing_is_cut_off_and_its_answer_dropped(
    address: tuple[str, int],
) -> None:
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        # The server gives the connection up; before, it kept it and the answer's bytes
        # for as long as the client stayed connected without reading.
        assert LOST.wait(30), "the connection is still held for a client that reads nothing"
        received = _read_all(sock)
    # What the kernel had taken before the abort arrives, then the end: not the answer.
    assert b"200 OK" in received[:64]
    assert len(received) < SIZE


def test_a_client_that_reads_slowly_gets_its_whole_answer(address: tuple[str, int]) -> None:
    size = 8 * 2**20
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(f"GET /big?size={size} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = b""
        head = b""
        started = time.monotonic()
        while len(received) < size:
            chunk = sock.recv(256 * 1024)  # a quarter MiB a tenth of a second: far past
            assert chunk, "the connection ended before the whole answer"  # STALL_S in all
            received += chunk
            if not head and b"\r\n\r\n" in received:
                head, _, received = received.partition(b"\r\n\r\n")
            time.sleep(0.1)
        assert time.monotonic() - started > 2 * STALL_S  # slower than the deadline in all
    assert b"200 OK" in head
    assert len(received) == size
