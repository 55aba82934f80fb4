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

Only Starlette's public API and the ASGI scope are used: the path a route is
matched against is computed here (``route_path``) rather than taken from
Starlette's private ``_utils``, which may change in any release.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.responses import handled_error

Handler = Callable[[Request], Awaitable[Response]]


def route_path(scope: Scope) -> str:
    """The request path below the application's mount point, as routes see it.

    In the ASGI scope ``path`` is the whole path and ``root_path`` the prefix the
    application is mounted at (behind a proxy's ``--root-path``, under a Mount):
    ``/api/v1/x`` with root ``/api`` is ``/v1/x``. A root that is not a whole
    leading segment of the path (``/api`` in ``/apix``) is not stripped, as
    Starlette's router does.
    """
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    rest = path[len(root) :]
    return rest if not rest or rest.startswith("/") else path


class DirectRoutes:
    """ASGI middleware answering (method, path) pairs with their handler."""

    def __init__(self, app: ASGIApp, routes: Mapping[tuple[str, str], Handler]) -> None:
        self.app = app
        self.routes = dict(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = None
        if scope["type"] == "http":
            handler = self.routes.get((scope["method"], route_path(scope)))
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
