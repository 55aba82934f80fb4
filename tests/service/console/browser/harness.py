"""The service as a subprocess and a Chromium that records every URL a page asks for."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from service.demo import demo_snapshots

LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
LOCAL_SCHEMES = frozenset({"data", "blob", "about", "chrome-error"})
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "host", "proxy-connection"}
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    """`topoplace serve` on loopback with its own SQLite file."""

    root: Path
    process: subprocess.Popen[bytes]
    url: str
    token: str | None = None

    def headers(self, token: str | None = None) -> dict[str, str]:
        token = token or self.token
        return {"Authorization": f"Bearer {token}"} if token else {}

    def call(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
        response = httpx.request(
            method, self.url + path, headers=self.headers(token), timeout=10, **kwargs
        )
        assert response.status_code < 300, (path, response.status_code, response.text)
        return response.json()

    def report_demo_fleet(self) -> None:
        for snap in demo_snapshots():
            self.call(
                "PUT",
                f"/v1/nodes/{snap.name}/snapshot",
                json={"snapshot": snap.model_dump(mode="json")},
            )

    def log_tail(self) -> str:
        path = self.root / "service.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_service(
    root: Path, flags: list[str], env: dict[str, str], token: str | None = None
) -> Served:
    port = free_port()
    environment = {
        **os.environ,
        "TOPOPLACE_DATABASE_URL": f"sqlite:///{root / 'topoplace.sqlite3'}",
        "TOPOPLACE_HEARTBEAT_TTL_S": "86400",
        # tests/conftest.py opens the in-process apps; a served one is as its flags say.
        "TOPOPLACE_INSECURE_DEV": "0",
        **env,
    }
    log = open(root / "service.log", "wb")  # noqa: SIM115 - the process owns it
    command = [sys.executable, "-m", "topoplace", "serve", "--port", str(port), "--no-grpc"]
    process = subprocess.Popen(
        [*command, *flags],
        env=environment,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    served = Served(root, process, f"http://127.0.0.1:{port}", token)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"topoplace serve exited: {served.log_tail()}")
        try:
            if httpx.get(f"{served.url}/readyz", timeout=1).status_code == 200:
                return served
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    served.stop()
    raise TimeoutError(f"topoplace serve not ready: {served.log_tail()}")


@dataclass
class Browser:
    driver: webdriver.Chrome
    artefacts: Path
    sent: dict[str, str] = field(default_factory=dict)
    blocked: set[str] = field(default_factory=set)

    def open(self, url: str) -> None:
        self.driver.get(url)

    def wait(self, check: Any, what: str, timeout_s: float = 30) -> Any:
        try:
            return WebDriverWait(self.driver, timeout_s, poll_frequency=0.05).until(
                lambda _: check()
            )
        except Exception as exc:
            self.screenshot("failed-" + "".join(c if c.isalnum() else "-" for c in what)[:60])
            raise AssertionError(f"waited {timeout_s}s for {what}") from exc

    def css(self, selector: str) -> list[WebElement]:
        return list(self.driver.find_elements("css selector", selector))

    def text(self, selector: str) -> str:
        """The text of the first element ``selector`` matches, read in one step (the
        console redraws its tables every second, so a held element goes stale)."""
        script = "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;"
        found = self.driver.execute_script(script, selector)
        assert found is not None, f"nothing matches {selector}"
        return str(found)

    def texts(self, selector: str) -> list[str]:
        script = "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText);"
        return list(self.driver.execute_script(script, selector))

    def attrs(self, selector: str, attribute: str) -> list[str | None]:
        """``attribute`` of every element ``selector`` matches, read in one step."""
        script = (
            "return [...document.querySelectorAll(arguments[0])]"
            ".map((e) => e.getAttribute(arguments[1]));"
        )
        return list(self.driver.execute_script(script, selector, attribute))

    def screenshot(self, name: str) -> Path:
        path = self.artefacts / f"{name}.png"
        self.driver.save_screenshot(str(path))
        print(f"screenshot: {path}")
        return path

    def requested(self) -> list[str]:
        """Every URL the pages asked the network for (Chrome's network log), so far.

        A request the page's Content-Security-Policy refused never leaves the browser:
        Chrome logs it, then logs it blocked (``csp``); it is left out."""
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            params = message.get("params", {})
            if message.get("method") == "Network.requestWillBeSent":
                self.sent[params["requestId"]] = params["request"]["url"]
            elif (
                message.get("method") == "Network.loadingFailed"
                and params.get("blockedReason") == "csp"
            ):
                self.blocked.add(params["requestId"])
        return [url for key, url in self.sent.items() if key not in self.blocked]

    def quit(self) -> None:
        self.driver.quit()


def is_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in LOCAL_SCHEMES or parts.hostname in LOOPBACK


def start_browser(chromium: str, driver: str, artefacts: Path) -> Browser:
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        # As on a cluster with no way out: no name resolves; loopback is an address.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    chrome = webdriver.Chrome(service=DriverService(driver), options=options)
    chrome.set_page_load_timeout(60)
    return Browser(chrome, artefacts)


class PrefixProxy:
    """A reverse proxy on loopback serving ``upstream`` under ``prefix``, stripping it
    before passing a request on, as an ingress with a rewrite does."""

    def __init__(self, upstream: str, prefix: str) -> None:
        self.upstream, self.prefix = upstream, prefix
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                if not self.path.startswith(proxy.prefix + "/"):
                    self.send_error(404, "outside the prefix")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
                headers["X-Forwarded-Prefix"] = proxy.prefix
                answer = httpx.request(
                    self.command,
                    proxy.upstream + self.path[len(proxy.prefix) :],
                    headers=headers,
                    content=body,
                    timeout=30,
                )
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in HOP_BY_HOP | {"content-length", "content-encoding"}:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet: the service's own log says what was asked

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}{prefix}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()
