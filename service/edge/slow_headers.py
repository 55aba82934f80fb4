"""A deadline for a request's headers, which no ASGI middleware can see.

uvicorn hands a request to the application only once its headers are
complete, and sets no limit on how long they take: a client sending a byte
of headers every few seconds held a connection (and its memory) for as long
as it liked, and 40 of them stayed open 30 s and more. Here the protocol
itself starts a timer when a connection opens and when a request's first
byte arrives, and stops it when the headers are complete; when it fires,
the client gets 408 in the service's error shape and the connection is
closed. The body has its own deadline, in the request guard (guard.py).
Idle kept-alive connections are uvicorn's own ``timeout_keep_alive``.

The same protocol answers a request it cannot parse (a header line with no
name, an empty Transfer-Encoding) in the service's error shape too: uvicorn's
own answer is a text/plain "Invalid HTTP request received.", which no client
of the API's document expects.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.edge.one_segment import hold_heads
from service.edge.stalled_reader import StalledReaderDeadline
from service.errors import BadRequest, RequestTimeout, ServiceError

_REASONS = {400: b"Bad Request", 408: b"Request Timeout"}


def raw_error_response(error: ServiceError) -> bytes:
    """The whole HTTP response for ``error``, written by the protocol itself (no
    application sees these requests); the connection is closed after it."""
    body = json.dumps(error.body()).encode()
    head = (
        b"HTTP/1.1 %d %s\r\n"
        % (error.status, _REASONS[error.status])
        + b"content-type: application/json\r\n"
        b"connection: close\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    return head + body


def with_header_deadline(seconds: float, stalled_reader_s: float = 30.0) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a ``seconds`` deadline on every request's headers,
    and a connection whose client reads nothing of its answer for ``stalled_reader_s``
    aborted (stalled_reader.py)."""

    stall_s = stalled_reader_s

    class HeaderDeadline(StalledReaderDeadline, HttpToolsProtocol):
        header_timeout_s = seconds
        # A class body reads its own names, not the function's: hence ``stall_s``.
        stalled_reader_s = stall_s
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            before = self.cycle
            super().on_headers_complete()
            if self.cycle is not None and self.cycle is not before:
                hold_heads(self.cycle)

        def send_400_response(self, msg: str) -> None:
            # uvicorn's answer to what it cannot parse, in the service's shape (JSON, a
            # stable code); the rest of such a connection cannot be read, so it closes.
            error = BadRequest(f"not a valid HTTP/1.1 request: {msg}")
            self.transport.write(raw_error_response(error))
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)  # the stalled-reader watch, then uvicorn's

        def _arm(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _too_slow(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            error = RequestTimeout(
                f"the request's headers did not arrive within {self.header_timeout_s:g} s"
                " (TOPOPLACE_HEADER_TIMEOUT_S)",
                {"limit_s": self.header_timeout_s, "part": "headers"},
            )
            self.transport.write(raw_error_response(error))
            self.transport.close()

    return HeaderDeadline
