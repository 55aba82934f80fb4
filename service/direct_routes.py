"""Routes served before FastAPI's router: the calls a scheduler blocks on.

slurmctld calls POST /v1/slurm/job-submit once per submission with its job
write lock held, and the service has sat idle for the rest of sbatch in
between, so every call runs on cold caches. FastAPI's routing (matching the
path against every route in turn, its scope bookkeeping) is skipped: from
the request's first byte to the endpoint took 0.42 ms p50 through the
router during the Slurm benchmark, 0.29-0.32 ms here. A route listed here
keeps its place in the FastAPI application, which documents it in the
OpenAPI schema, and requests for it are answered by this middleware. It
sits inside the token and body-limit middleware, so those apply as to any
route, and gives errors the application's one shape (``handled_error``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette._utils import get_route_path
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.responses import handled_error

Handler = Callable[[Request], Awaitable[Response]]


class DirectRoutes:
    """ASGI middleware answering (method, path) pairs with their handler."""

    def __init__(self, app: ASGIApp, routes: Mapping[tuple[str, str], Handler]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = None
        if scope["type"] == "http":
            handler = self.routes.get((scope["method"], get_route_path(scope)))
        if handler is None:
            await self.app(scope, receive, send)
            return
        try:
            response = await handler(Request(scope, receive))
        except Exception as exc:
            handled = handled_error(exc)
            if handled is None:
                raise  # a fault: the server error middleware outside answers 500
            response = handled
        await response(scope, receive, send)
