"""Real service processes for tests: `topoplace serve` on loopback ports of their own."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"service at {url} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"service at {url} not ready after {deadline_s}s")


def start(
    database_url: str, env: Mapping[str, str], port: int | None = None
) -> tuple[str, subprocess.Popen[bytes]]:
    """One `topoplace serve` (REST only) on ``database_url``; returns (base URL, process)
    without waiting for it to be ready. Insecure (no token needed) unless ``env`` says
    otherwise: the replica tests are about keeping processes in step."""
    port = port or free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "topoplace", "serve", "--port", str(port), "--no-grpc"],
        env={
            **os.environ,
            "TOPOPLACE_INSECURE_DEV": "1",
            "TOPOPLACE_DATABASE_URL": database_url,
            **env,
        },
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return f"http://127.0.0.1:{port}", proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@dataclass
class Running:
    """Service processes and their URLs; a process replaced in ``procs`` (a restart) is
    the one stopped at the end."""

    urls: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)


@contextlib.contextmanager
def replicas(database_url: str, count: int, env: Mapping[str, str]) -> Iterator[Running]:
    """``count`` service processes on one database, each stopped by its own handle."""
    running = Running()
    try:
        for _ in range(count):
            url, proc = start(database_url, env)
            running.urls.append(url)
            running.procs.append(proc)
        for url, proc in zip(running.urls, running.procs, strict=True):
            wait_ready(url, proc)
        yield running
    finally:
        for proc in running.procs:
            stop(proc)
