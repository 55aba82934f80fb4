"""`topoplace serve` starts REST and gRPC in one process; --no-grpc serves REST only."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from tests.service.grpc.conftest import snapshot_request
from tests.service.replica_processes import free_port


def _serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "TOPOPLACE_DATABASE_URL": f"sqlite:///{tmp_path / 's.sqlite3'}"}
    env.pop("TOPOPLACE_GRPC_PORT", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "topoplace", "serve", "--port", str(port), *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(proc.stderr.read().decode() if proc.stderr else "exited")
        try:
            if httpx.get(f"{url}/readyz", timeout=1, trust_env=False).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    proc.terminate()
    raise AssertionError("the service did not become ready")


def test_serve_starts_both_transports_on_one_state(tmp_path: Path) -> None:
    grpc_port = free_port()
    proc, url = _serve(tmp_path, "--grpc-port", str(grpc_port))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.TopoplaceStub(channel)
            stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"), timeout=10)
            placed = stub.Place(pb.PlaceRequest(gpus=2), timeout=10)
        # What gRPC did, REST sees at once: one process, one state.
        node = httpx.get(f"{url}/v1/nodes/h0", trust_env=False).json()
        assert len(node["free_gpus"]) == 6 and node["allocations"] == [placed.id]
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_no_grpc_serves_rest_only(tmp_path: Path) -> None:
    grpc_port = free_port()
    proc, url = _serve(tmp_path, "--no-grpc", "--grpc-port", str(grpc_port))
    try:
        assert httpx.get(f"{url}/healthz", trust_env=False).status_code == 200
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", grpc_port)) != 0
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _serve_on_taken_port(tmp_path: Path, *args: str) -> tuple[int, str, int]:
    """serve with ``args``, where ``{taken}`` is a port a listener holds: (exit, stderr, port)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "TOPOPLACE_DATABASE_URL": f"sqlite:///{tmp_path / 's.sqlite3'}"}
        env.pop("TOPOPLACE_GRPC_PORT", None)
        command = [sys.executable, "-m", "topoplace", "serve", "--insecure-dev"]
        command += [a.format(taken=port, free=free_port()) for a in args]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr, port


def test_a_grpc_port_in_use_is_one_line_naming_the_flags(tmp_path: Path) -> None:
    code, err, port = _serve_on_taken_port(tmp_path, "--port", "{free}", "--grpc-port", "{taken}")
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [
        f"error: the gRPC port 127.0.0.1:{port} is in use (another topoplace serve?): give"
        " another with --grpc-port PORT (TOPOPLACE_GRPC_PORT; 0: any free one), or serve REST"
        " only with --no-grpc"
    ]


def test_a_rest_port_in_use_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    code, err, port = _serve_on_taken_port(tmp_path, "--port", "{taken}", "--no-grpc")
    assert code == 2
    assert err.strip() == (
        f"error: the REST port 127.0.0.1:{port} is in use (another topoplace serve?):"
        " give another with --port PORT (TOPOPLACE_PORT)"
    )


def test_the_grpc_server_still_names_a_port_it_cannot_bind(tmp_path: Path) -> None:
    """A port taken between the check and the start: the service's own error names it."""
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.settings import Settings

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        url = f"sqlite:///{tmp_path / 's.sqlite3'}"
        app = create_app(Settings(database_url=url, grpc_port=port, insecure_dev=True))
        refused = pytest.raises(Exception, match=f"could not start on 127.0.0.1:{port}")
        with refused, TestClient(app):
            pass
