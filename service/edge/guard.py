"""Checks every HTTP request passes before a route reads it, in one place.

- The URL (path and query) is at most :data:`MAX_URL_BYTES` (414): the HTTP
  server's own limit answers in its own shape, or not at all.
- No control character (nor lone surrogate) in the decoded path, the decoded
  query string or the headers the service reads (422 ``invalid_request``):
  they go to the database as they are, and no route has a use for them.
- The body is read here, counted as it arrives, and refused with 413 as soon
  as it passes the limit (``/v1/place`` and ``/v1/score`` have a lower one of their
  own: :data:`PLACEMENT_PATHS`; a pushed squeue answer a higher one:
  :data:`RECONCILE_PATH`), whether it came with a Content-Length or chunked,
  and with 408 when it has not all arrived within ``body_timeout_s`` (the
  connection is closed after either: the rest of the body is never read;
  the headers' own deadline is slow_headers.py);
  it is then checked for nesting depth (json_scan; the reconcile route's own decoder
  checks its body, piece by piece off the loop) and handed on, whole, to
  the application, which reads it as usual; unless the caller's token was
  revoked while it arrived (401, revoked_meanwhile.py). Control characters in the body
  are refused field by field (``placement.text.Text``): free-form bodies
  (Kubernetes pods, squeue output) carry newlines legitimately.

A plain ASGI middleware: Starlette's BaseHTTPMiddleware would add a task and a
memory stream to every request on the /place hot path. On that path the work
added is one regular-expression search of the path and of each header value,
and a count of brackets in the body.
"""

from __future__ import annotations

import asyncio
import re
from urllib.parse import unquote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from placement.text import forbidden_character
from service.direct_routes import route_path
from service.edge import revoked_meanwhile
from service.edge.json_scan import MAX_DEPTH, too_deep
from service.errors import InvalidRequest, RequestTimeout, ServiceError, TooLarge, UriTooLong
from service.responses import error_response

MAX_URL_BYTES = 8 * 1024
# In a header value HTTP allows visible characters, spaces and tabs only. The HTTP
# server refuses others already; checked again for the headers whose values the
# service keeps or compares, whatever server runs it.
_HEADER_CONTROL = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_READ_HEADERS = frozenset({b"idempotency-key", b"authorization"})
# Once: of two keys the first was read, so a retry through a proxy that joins them ("a,
# b", RFC 9110) or keeps the other one reserved a second time.
_ONCE = b"idempotency-key"
# Their bodies are parsed and validated on the event loop, about 35 ms a megabyte of
# node names, while every other request of the process waits: a 4 MB list stalled them
# for 600 ms. Other routes keep the general limit (snapshots, extender bodies).
PLACEMENT_PATHS = frozenset({"/v1/place", "/v1/score"})
PLACEMENT_LIMIT_SETTING = "TOPOPLACE_MAX_PLACEMENT_BODY_BYTES"
# cron pushes the whole of `squeue --json` here: Slurm 22.05 prints 3.2 KB a pending job
# and 3.9-4.1 KB a running one, so 4 MiB held about 1,200 jobs and a production queue's
# push was refused, its reconcile never run. Safe to raise because RequireToken runs
# before this guard (service/app.py adds it outside): only a token allowed this route (a
# scheduler's) gets its body read at all; any other is answered 401/403 first.
RECONCILE_PATH = "/v1/slurm/reconcile"
RECONCILE_LIMIT_SETTING = "TOPOPLACE_MAX_RECONCILE_BODY_BYTES"


class RequestGuard:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout_s: float = 30.0,
        max_placement_body_bytes: int | None = None,
        max_reconcile_body_bytes: int | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.max_placement_body_bytes = min(
            max_body_bytes,
            max_body_bytes if max_placement_body_bytes is None else max_placement_body_bytes,
        )
        # Never below the general limit: raising that one raises it for every route.
        self.max_reconcile_body_bytes = max(max_body_bytes, max_reconcile_body_bytes or 0)

    def _limit(self, scope: Scope) -> tuple[int, str]:
        """The body limit of this request's route, and the setting that sets it."""
        # The path as routes see it: behind a proxy's root path, /api/v1/place is /v1/place.
        path = route_path(scope)
        if path in PLACEMENT_PATHS and self.max_placement_body_bytes < self.max_body_bytes:
            return self.max_placement_body_bytes, PLACEMENT_LIMIT_SETTING
        if path == RECONCILE_PATH and self.max_reconcile_body_bytes > self.max_body_bytes:
            return self.max_reconcile_body_bytes, RECONCILE_LIMIT_SETTING
        return self.max_body_bytes, "TOPOPLACE_MAX_BODY_BYTES"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._url_or_header_problem(scope)
        if refusal is not None:
            await error_response(refusal)(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body, end, refusal = await self._read_body(receive, self._limit(scope))
        except TimeoutError:
            body, end = b"", None
            refusal = RequestTimeout(
                f"the request's body did not arrive within {self.body_timeout_s:g} s"
                " (TOPOPLACE_BODY_TIMEOUT_S)",
                {"limit_s": self.body_timeout_s, "part": "body"},
            )
        if refusal is not None:
            response = error_response(refusal)
            if isinstance(refusal, TooLarge | RequestTimeout):
                # The rest of the body is not read: the connection cannot carry another request.
                response.headers["Connection"] = "close"
            await response(scope, receive, send)
            return
        if end is not None:  # the client went away while sending
            return
        # The reconcile route checks its megabytes piece by piece on a worker thread
        # (json_command.parse_json): scanned here, on the loop, 20 MB held it 330 ms.
        if body and route_path(scope) != RECONCILE_PATH and too_deep(body):
            refusal = InvalidRequest("body", f"JSON nested deeper than {MAX_DEPTH} levels")
            await error_response(refusal)(scope, receive, send)
            return
        revoked = revoked_meanwhile.refusal()  # while the body arrived (seconds, for a slow one)
        if revoked is not None:
            response = error_response(revoked)
            response.headers["WWW-Authenticate"] = "Bearer"
            await response(scope, receive, send)
            return
        await self.app(scope, replay_body(body, receive), send)

    def _url_or_header_problem(self, scope: Scope) -> ServiceError | None:
        path: str = scope["path"]
        query: bytes = scope.get("query_string", b"")
        if len(scope.get("raw_path") or path.encode()) + len(query) > MAX_URL_BYTES:
            return UriTooLong(f"the path and query are over {MAX_URL_BYTES} bytes")
        bad = forbidden_character(path)
        if bad is not None:
            return InvalidRequest("path", f"control characters are not allowed (U+{ord(bad):04X})")
        if query:
            bad = forbidden_character(unquote(query.decode("latin-1")))
            if bad is not None:
                return InvalidRequest(
                    "query", f"control characters are not allowed (U+{ord(bad):04X})"
                )
        limit = self._limit(scope)
        read: set[bytes] = set()
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if value.isdigit() and int(value) > limit[0]:
                    return _too_large(f"request body of {value.decode()} bytes", limit)
            elif name in _READ_HEADERS:
                header = name.decode("latin-1")
                if _HEADER_CONTROL.search(value):
                    return InvalidRequest(f"header.{header}", "control characters are not allowed")
                if name == _ONCE and name in read:
                    return InvalidRequest(f"header.{header}", "given more than once: send it once")
                read.add(name)
        return None

    async def _read_body(
        self, receive: Receive, limit: tuple[int, str]
    ) -> tuple[bytes, Message | None, ServiceError | None]:
        """The whole body; or the disconnect that ended it; or the refusal of an oversized one."""
        message = await receive()
        if message["type"] == "http.request" and not message.get("more_body", False):
            first: bytes = message.get("body", b"")  # the whole body in one message: usual
            if len(first) > limit[0]:
                return b"", None, _too_large(f"request body of {len(first)} bytes", limit)
            return first, None, None
        chunks: list[bytes] = []
        size = 0
        while True:
            if message["type"] != "http.request":
                return b"", message, None
            chunk: bytes = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit[0]:
                    return b"", None, _too_large(f"request body of at least {size} bytes", limit)
                chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks), None, None
            message = await receive()


def _too_large(what: str, limit: tuple[int, str]) -> TooLarge:
    return TooLarge(f"{what} is over the limit of {limit[0]} ({limit[1]})", {"limit": limit[0]})


def replay_body(body: bytes, receive: Receive) -> Receive:
    """The body as one message, then whatever the client sends next (its disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
