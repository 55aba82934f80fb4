"""The Binding POST's kept-alive connection: reused, renewed when the server closed it, TLS."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from service.k8s.kube_api import HttpKubeApi, KubeApiError
from tests.tls_ca import make_pki

TOKEN = "t0ken"


class _Recorder:
    def __init__(self) -> None:
        self.connections: set[int] = set()  # client ports seen
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str | None] = []
        self.close_after_answer = False  # as a server whose idle timeout ends each connection
        self.status = 201


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


def test_binds_share_one_connection_and_carry_the_binding_and_token() -> None:
    with _server() as (url, seen):
        client = HttpKubeApi(url, token=lambda: TOKEN)
        for i in range(5):
            client.bind("ml", f"p{i}", f"uid-{i}", "n1", {"topoplace.io/gpus": "0,1"})
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


def test_a_connection_the_server_closed_is_replaced_and_the_bind_still_made() -> None:
    with _server() as (url, seen):
        seen.close_after_answer = True
        client = HttpKubeApi(url, token=lambda: TOKEN)
        for i in range(3):
            client.bind("ml", f"p{i}", "", "n1", {})
    assert len(seen.bodies) == 3  # each POST arrived once
    assert len(seen.connections) == 3


def test_a_refusal_carries_the_status_and_the_servers_message() -> None:
    with _server() as (url, seen):
        seen.status = 409
        client = HttpKubeApi(url, token=lambda: TOKEN)
        with pytest.raises(KubeApiError) as refused:
            client.bind("ml", "p0", "", "n1", {})
    assert refused.value.status == 409 and refused.value.message == "nope"


def test_an_unreachable_server_is_status_0_for_a_bind() -> None:
    client = HttpKubeApi("http://127.0.0.1:9", timeout_s=0.5)
    with pytest.raises(KubeApiError) as failed:
        client.bind("ml", "p0", "", "n1", {})
    assert failed.value.status == 0


def test_tls_is_verified_against_the_given_ca(tmp_path: Path) -> None:
    pki = make_pki(tmp_path)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(pki.cert, pki.key)
    with _server(server_side) as (url, seen):
        trusted = ssl.create_default_context(cafile=str(pki.ca))
        HttpKubeApi(url, token=lambda: TOKEN, verify=trusted).bind("ml", "p0", "", "n1", {})
        assert len(seen.bodies) == 1
        stranger = ssl.create_default_context(cafile=str(pki.other_ca))
        with pytest.raises(KubeApiError) as refused:
            HttpKubeApi(url, verify=stranger).bind("ml", "p1", "", "n1", {})
        assert refused.value.status == 0 and "CERTIFICATE_VERIFY_FAILED" in refused.value.message
    assert len(seen.bodies) == 1
