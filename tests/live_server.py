"""A real service for tests: uvicorn serving an app on a loopback port of its own, in a thread."""

from __future__ import annotations

import contextlib
import socket
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

# How long the service may take to stop. Back to back it takes 0.2 s; once, late in a
# whole-suite run on a loaded 2-CPU machine, it took past the 10 s allowed before, which
# no rerun reproduced. A stop that hangs still fails, naming what every thread was doing.
STOP_S = 30.0


def _stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"--- {names.get(ident, ident)}\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in sys._current_frames().items()
    )


def _wait_ready(
    url: str, thread: threading.Thread, timeout_s: float, verify: ssl.SSLContext | bool
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not thread.is_alive():
            pytest.fail("the service thread stopped before it was ready")
        try:
            answer = httpx.get(f"{url}/readyz", timeout=1.0, trust_env=False, verify=verify)
            if answer.status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    pytest.fail(f"the service at {url} was not ready within {timeout_s:g} s")


@contextlib.contextmanager
def live_server(
    app: FastAPI,
    timeout_s: float = 10.0,
    *,
    options: dict[str, Any] | None = None,
    ca_bundle: str | None = None,
) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL once /readyz answers 200.

    ``options``: more uvicorn settings (``topoplace serve``'s own, say); with
    ``ssl_certfile`` the URL is https, checked against ``ca_bundle``."""
    # uvicorn serves on a socket bound here, so no other process can take the
    # port between choosing it and listening on it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = {**(options or {}), "log_level": "warning", "lifespan": "on"}
    config.pop("host", None), config.pop("port", None)
    server = uvicorn.Server(uvicorn.Config(app, **config))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    tls = bool(config.get("ssl_certfile"))
    url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca_bundle) if tls else True
    try:
        _wait_ready(url, thread, timeout_s, verify)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=STOP_S)
        sock.close()
    if thread.is_alive():
        pytest.fail(f"the service did not stop within {STOP_S:g} s; its threads:\n{_stacks()}")
