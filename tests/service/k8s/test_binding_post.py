"""The Binding POST's kept-alive connection: reused, renewed when the server closed it, TLS.

Each case runs both ways a bind posts: blocking on a worker thread (``bind``)
and awaited on the event loop (``bind_async``, asyncio streams).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from service.k8s.kube_api import HttpKubeApi, KubeApiError
from tests.tls_ca import make_pki

TOKEN = "t0ken"
MODES = ("thread", "loop")
Bind = tuple[str, str, str, str, dict[str, str]]


def _binds(client: HttpKubeApi, mode: str, *calls: Bind) -> None:
    """The binds in order, on one thread or one event loop (where connections are kept)."""
    if mode == "thread":
        for call in calls:
            client.bind(*call)
        return

    async def run() -> None:
        for call in calls:
            await client.bind_async(*call)

    asyncio.run(run())


class _Recorder:
    def __init__(self) -> None:
        self.connections: set[int] = set()  # client ports seen
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.close_after_answer = False  # as a server whose idle timeout ends each connection
        self.status = 201
        self.chunked = False  # the answer's body in chunks, as Go's server sends a large one


def _handler(seen: _Recorder) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            seen.connections.add(self.client_address[1])
            seen.auth.append(self.headers.get("Authorization"))
            seen.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"kind": "Status", "message": "nope"}).encode()
            self.send_response(seen.status)
            self.send_header("Content-Type", "application/json")
            if seen.chunked:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                half = len(body) // 2
                for part in (body[:half], body[half:]):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.write(b"0\r\n\r\n")
            else:
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            self.wfile.flush()
            if seen.close_after_answer:
                self.close_connection = True  # closed without saying so in a header

    return Handler


@contextmanager
def _server(context: ssl.SSLContext | None = None) -> Iterator[tuple[str, _Recorder]]:
    seen = _Recorder()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(seen))
    server.daemon_threads = True
    scheme = "http"
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("mode", MODES)
def test_binds_share_one_connection_and_carry_the_binding_and_token(mode: str) -> None:
    with _server() as (url, seen):
        client = HttpKubeApi(url, token=lambda: TOKEN)
        notes = {"topoplace.io/gpus": "0,1"}
        _binds(client, mode, *[("ml", f"p{i}", f"uid-{i}", "n1", notes) for i in range(5)])
        client.close()
    assert len(seen.connections) == 1
    assert seen.auth == [f"Bearer {TOKEN}"] * 5
    first = seen.bodies[0]
    assert first["kind"] == "Binding" and first["target"]["name"] == "n1"
    assert first["metadata"] == {
        "name": "p0",
        "namespace": "ml",
        "uid": "uid-0",
        "annotations": {"topoplace.io/gpus": "0,1"},
    }


@pytest.mark.parametrize("mode", MODES)
def test_a_connection_the_server_closed_is_replaced_and_the_bind_still_made(mode: str) -> None:
    with _server() as (url, seen):
        seen.close_after_answer = True
        client = HttpKubeApi(url, token=lambda: TOKEN)
        _binds(client, mode, *[("ml", f"p{i}", "", "n1", {}) for i in range(3)])
    assert len(seen.bodies) == 3  # each POST arrived once
    assert len(seen.connections) == 3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunked", [False, True])
def test_a_refusal_carries_the_status_and_the_servers_message(mode: str, chunked: bool) -> None:
    with _server() as (url, seen):
        seen.status, seen.chunked = 409, chunked
        client = HttpKubeApi(url, token=lambda: TOKEN)
        with pytest.raises(KubeApiError) as refused:
            _binds(client, mode, ("ml", "p0", "", "n1", {}))
        seen.status = 201  # and the connection serves the next bind
        _binds(client, mode, ("ml", "p1", "", "n1", {}))
    assert refused.value.status == 409 and refused.value.message == "nope"
    assert len(seen.bodies) == 2


@pytest.mark.parametrize("mode", MODES)
def test_an_unreachable_server_is_status_0_for_a_bind(mode: str) -> None:
    client = HttpKubeApi("http://127.0.0.1:9", timeout_s=0.5)
    with pytest.raises(KubeApiError) as failed:
        _binds(client, mode, ("ml", "p0", "", "n1", {}))
    assert failed.value.status == 0


@pytest.mark.parametrize("mode", MODES)
def test_a_server_that_never_answers_is_status_0_within_the_timeout(mode: str) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts connections, never reads nor answers
    try:
        client = HttpKubeApi(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_s=0.3)
        started = time.monotonic()
        with pytest.raises(KubeApiError) as failed:
            _binds(client, mode, ("ml", "p0", "", "n1", {}))
        assert time.monotonic() - started < 2.0
    finally:
        silent.close()
    assert failed.value.status == 0


@pytest.mark.parametrize("mode", MODES)
def test_tls_is_verified_against_the_given_ca(tmp_path: Path, mode: str) -> None:
    pki = make_pki(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(pki.cert, pki.key)
    with _server(server_side) as (url, seen):
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        _binds(
            HttpKubeApi(url, token=lambda: TOKEN, verify=trusted), mode, ("ml", "p0", "", "n1", {})
        )
        assert len(seen.bodies) == 1
        stranger = ssl.create_default_context(cafile=str(pki.other_ca))
        with pytest.raises(KubeApiError) as refused:
            _binds(HttpKubeApi(url, verify=stranger), mode, ("ml", "p1", "", "n1", {}))
        assert refused.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in refused.value.message
    assert len(seen.bodies) == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_tls_connection_the_server_closed_is_replaced(tmp_path: Path, mode: str) -> None:
    """Closed after each answer without TLS's close_notify (as a load balancer cuts idle
    connections): the next bind goes on a new connection."""
    pki = make_pki(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(pki.cert, pki.key)
    with _server(server_side) as (url, seen):
        seen.close_after_answer = True
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        client = HttpKubeApi(url, token=lambda: TOKEN, verify=trusted)
        _binds(client, mode, *[("ml", f"p{i}", "", "n1", {}) for i in range(3)])
    assert len(seen.bodies) == 3
