"""Slow clients are cut off: headers or a body slower than their deadline get 408, closed.

Against a real uvicorn with `topoplace serve`'s own options (its protocol with
the header deadline), since a test client never sends anything slowly.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from topoplace.serve_cmd import uvicorn_options

DEADLINE_S = 1.0
SLOW_CLIENTS = 40
DRIP_INTERVAL_S = 0.2


def _serve(settings: Settings) -> Iterator[tuple[str, int]]:
    settings = settings.model_copy(
        update={"header_timeout_s": DEADLINE_S, "body_timeout_s": DEADLINE_S}
    )
    app = create_app(settings, background=False)
    with live_server(app, options=uvicorn_options(settings)) as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    yield from _serve(Settings(database_url=f"sqlite:///{tmp_path / 'slow.sqlite3'}"))


def _open(address: tuple[str, int], first: bytes) -> socket.socket:
    sock = socket.create_connection(address, timeout=5)
    sock.sendall(first)
    sock.setblocking(False)
    return sock


def _answer(received: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"connection: close" in head.lower()
    return status, json.loads(body)


def _drip_until_closed(
    drip: dict[socket.socket, bytes],
) -> tuple[dict[socket.socket, bytes], dict[socket.socket, float]]:
    """Each socket sends one byte of its drip a round (never done within the deadline) and
    reads what comes back, until the server has closed every one or ten deadlines have
    passed; then all are closed. What each received, and when each was closed (seconds)."""
    started = time.monotonic()
    received = {sock: b"" for sock in drip}
    closed_after: dict[socket.socket, float] = {}
    while len(closed_after) < len(drip) and time.monotonic() - started < 10 * DEADLINE_S:
        time.sleep(DRIP_INTERVAL_S)
        for sock in drip:
            if sock in closed_after:
                continue
            try:
                while chunk := sock.recv(65536):
                    received[sock] += chunk
                closed_after[sock] = time.monotonic() - started  # the server closed it
                continue
            except BlockingIOError:
                pass
            except ConnectionResetError:
                closed_after[sock] = time.monotonic() - started
                continue
            try:
                sock.send(drip[sock][:1])
            except OSError:
                closed_after[sock] = time.monotonic() - started
    for sock in drip:
        sock.close()
    return received, closed_after


def test_forty_slow_connections_are_answered_408_and_closed_at_the_deadline(
    server: tuple[str, int],
) -> None:
    half = SLOW_CLIENTS // 2
    # Half drip their headers; half send headers promptly and drip a body.
    start = b"POST /v1/place HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    slow_headers = [_open(server, start) for _ in range(half)]
    head = b"POST /v1/place HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    slow_bodies = [_open(server, head + b"Content-Length: 1000\r\n\r\n{") for _ in range(half)]
    drip = {
        sock: b"X-Slow: 1\r\n" if sock in slow_headers else b" "
        for sock in [*slow_headers, *slow_bodies]
    }
    received, closed_after = _drip_until_closed(drip)
    assert len(closed_after) == SLOW_CLIENTS, "some slow connections stayed open"
    # Cut off at the deadline (plus a drip round and some scheduling), not after 30 s.
    assert max(closed_after.values()) < DEADLINE_S + 1.5
    for sock, answer in received.items():
        status, body = _answer(answer)
        part = "headers" if sock in slow_headers else "body"
        assert status == 408
        error = body["error"]
        assert isinstance(error, dict) and error["code"] == "request_timeout"
        assert error["detail"] == {"limit_s": DEADLINE_S, "part": part}


def test_a_prompt_client_on_a_kept_connection_is_not_cut_off(server: tuple[str, int]) -> None:
    """Requests on one kept-alive connection, each sent at once, with pauses shorter than the
    keep-alive timeout between them: none of them meets the deadline."""
    with socket.create_connection(server, timeout=5) as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while not answer.endswith(b'{"status":"ok"}'):
                chunk = sock.recv(65536)
                assert chunk, "the connection was closed"
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 200")
            time.sleep(DEADLINE_S * 1.5)  # idle: the header deadline starts with a request


@pytest.fixture
def secured_server(tmp_path: Path) -> Iterator[tuple[str, int]]:
    yield from _serve(
        Settings(
            database_url=f"sqlite:///{tmp_path / 'secured.sqlite3'}",
            insecure_dev=False,
            api_tokens="s3cret-0123456789abcdef",
        )
    )


def test_a_request_refused_before_its_body_is_read_is_closed(
    secured_server: tuple[str, int],
) -> None:
    """A request answered before its body arrived (no token: 401, refused at the door)
    leaves the rest of the body unread: a client dripping it held the connection for as
    long as it liked, the body's deadline never running. The answer closes it."""
    head = b"POST /v1/place HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    socks = [_open(secured_server, head + b"Content-Length: 1000\r\n\r\n{") for _ in range(5)]
    received, closed_after = _drip_until_closed({sock: b" " for sock in socks})
    assert len(closed_after) == len(socks), "a refused request's connection stayed open"
    assert max(closed_after.values()) < DEADLINE_S + 1.5
    for answer in received.values():
        status, body = _answer(answer)
        error = body["error"]
        assert status == 401 and isinstance(error, dict) and error["code"] == "unauthorized"


@pytest.mark.parametrize(
    "head",
    [
        # What a schema fuzzer sent: a header with an empty Transfer-Encoding.
        b"POST /v1/regions HTTP/1.1\r\nHost: 127.0.0.1\r\ntransfer-encoding: \r\n"
        b"Content-Type: application/json\r\nContent-Length: 4\r\n\r\n\xff\x1b\x0c\xff",
        b"GET /healthz HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n",  # a header line without a colon
    ],
)
def test_a_request_that_is_no_http_is_answered_in_the_service_s_error_shape(
    server: tuple[str, int], head: bytes
) -> None:
    """The HTTP server's own answer to what it cannot parse was text/plain "Invalid HTTP
    request received.": a client reading the API's errors got no code to act on."""
    with socket.create_connection(server, timeout=5) as sock:
        sock.sendall(head)
        received = b""
        while chunk := sock.recv(65536):  # the answer closes the connection
            received += chunk
    assert b"content-type: application/json" in received.split(b"\r\n\r\n")[0].lower()
    status, body = _answer(received)
    error = body["error"]
    assert status == 400 and isinstance(error, dict) and error["code"] == "bad_request"
    assert "not a valid HTTP/1.1 request" in str(error["message"])
