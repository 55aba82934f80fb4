"""The real service behind a front that answers some requests itself, as a proxy or an
overloaded gateway would: each scripted answer is used once, then requests pass on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

# A scripted answer: its status, headers and JSON body.
Answer = tuple[int, dict[str, str] | None, dict[str, Any]]

BUSY = {"error": {"code": "rate_limited", "message": "slow down"}}
DOWN = {"error": {"code": "database_unavailable", "message": "the database is unavailable"}}
# The service asking to be asked later: a 429 with its Retry-After, a 503 without.
TRY_LATER: list[Answer] = [(429, {"Retry-After": "1"}, BUSY), (503, None, DOWN)]


class ScriptedFront:
    """``answer(status, headers, json)`` queues an answer for the next request to
    ``/v1/...``; ``seen`` lists the method and path of every such request."""

    def __init__(self, app: FastAPI) -> None:
        self.answers: list[Response] = []
        self.seen: list[tuple[str, str]] = []

        @app.middleware("http")
        async def front(
            request: Request, call_next: Callable[[Request], Awaitable[Response]]
        ) -> Response:
            if not request.url.path.startswith("/v1/"):
                return await call_next(request)
            self.seen.append((request.method, request.url.path))
            if self.answers:
                return self.answers.pop(0)
            return await call_next(request)

    def answer(self, status: int, headers: dict[str, str] | None = None, json: Any = None) -> None:
        self.answers.append(JSONResponse(json, status_code=status, headers=headers))
