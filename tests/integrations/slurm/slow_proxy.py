"""An HTTP proxy in front of the service that answers each request late.

The service gets every request and answers it (a filter's reservation is
made); job_submit.lua gets the answer only after its timeout, so the job goes
on unchanged: what a slow service does to a submission.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from types import TracebackType
from urllib.parse import urlsplit


class SlowProxy:
    def __init__(self, target: str, delay_s: float) -> None:
        parts = urlsplit(target)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.delay_s = delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.forwarded = 0
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> SlowProxy:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
            length = int(headers.get("Content-Length", "0"))
            while len(body) < length:
                body += conn.recv(65536)
            upstream = http.client.HTTPConnection(self.host, self.port, timeout=10)
            upstream.request(method, path, body=body, headers=headers)
            answer = upstream.getresponse()
            payload = answer.read()
            upstream.close()
            self.forwarded += 1
            time.sleep(self.delay_s)
            conn.sendall(
                f"HTTP/1.1 {answer.status} {answer.reason}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
