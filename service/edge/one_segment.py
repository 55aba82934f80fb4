"""An answer's status line, headers and body leave in one write.

uvicorn writes a response's status line and headers when the application
sends ``http.response.start`` and the body with the next message: two
``send`` calls, two TCP segments, and on the client two reads, for answers
of a few hundred bytes. The schedulers wait on exactly those answers (the
extender's three a pod, the Slurm filter's one a job), and on a 2-CPU AMD
EPYC guest the status-line write alone took 0.08 ms of the event loop per
answer (a py-spy sample of the Kubernetes bench). Here the head of an answer
whose length is declared is held until the body's first write and sent with
it; an answer without a length (chunked, streamed) and the answer to a HEAD
(which has no body write) are written as uvicorn writes them, so a stream's
headers never wait on its first chunk.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol


class _Cycle(Protocol):
    """What is read of uvicorn's request-response cycle (httptools_impl)."""

    scope: Any
    response_started: bool
    chunked_encoding: bool | None
    transport: asyncio.Transport


class OneSegment:
    """The transport as one request's cycle sees it, holding the answer's head."""

    __slots__ = ("_body_started", "_cycle", "_head", "_transport")

    def __init__(self, transport: asyncio.Transport, cycle: _Cycle) -> None:
        self._transport = transport
        self._cycle = cycle
        self._head: bytes | None = None
        self._body_started = False

    def write(self, data: bytes) -> None:
        if self._head is not None:  # the body's first write: the head goes with it
            data, self._head = self._head + data, None
            self._body_started = True
        elif (
            self._cycle.response_started
            and not self._body_started
            and self._cycle.chunked_encoding is False  # a Content-Length was declared
            and self._cycle.scope["method"] != "HEAD"  # whose body uvicorn never writes
        ):
            self._head = data  # the status line and headers: held for the body
            return
        elif self._cycle.response_started:
            self._body_started = True
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        # Everything else (close, is_closing, get_extra_info, flow control) is the
        # transport's own.
        return getattr(self._transport, name)


def hold_heads(cycle: _Cycle) -> None:
    """From now on the cycle writes each answer in one segment."""
    cycle.transport = OneSegment(cycle.transport, cycle)  # type: ignore[assignment]
