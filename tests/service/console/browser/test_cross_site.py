"""A page of another site, opened in the browser of someone running --insecure-dev (or
--demo), posts a form to the service: without a token that call was an admin's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from tests.service.console.browser.harness import Browser, Served

TARGET = "h100-b"


@pytest.fixture
def elsewhere(demo: Served) -> Iterator[str]:
    """Another site's page (another port: another origin) that posts a form on load."""
    page = (
        f'<!doctype html><form id="f" method="POST" enctype="text/plain"'
        f' action="{demo.url}/v1/nodes/{TARGET}/cordon"></form>'
        "<script>document.getElementById('f').submit()</script>"
    ).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _state(demo: Served) -> str:
    return str(httpx.get(f"{demo.url}/v1/nodes/{TARGET}", timeout=10).json()["state"])


def test_another_sites_form_cannot_change_an_insecure_service(
    browser: Browser, demo: Served, elsewhere: str
) -> None:
    assert _state(demo) == "ready"
    try:
        browser.open(elsewhere)
        browser.wait(lambda: browser.driver.current_url.startswith(demo.url), "the form's post")
        browser.wait(lambda: browser.text("body").startswith("{"), "the service's answer")
        assert _state(demo) == "ready", browser.text("body")[:200]
        assert "may not change an --insecure-dev service" in browser.text("body")
    finally:
        httpx.post(f"{demo.url}/v1/nodes/{TARGET}/uncordon", timeout=10)
