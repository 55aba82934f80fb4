"""The outermost middleware: each HTTP request's latency, by route template and outcome.

The route is the template the router matched (``/v1/nodes/{name}``), never
the path, so node names and ids do not become series; a request no route
matched counts as ``unmatched``, and so does one answered before routing
(throttled, refused by the token check or the request limits): finding its
template would cost a match against every route on exactly the requests a
flood is made of. The outcome is the status class (``2xx``)
and, for an error, the error's stable ``code`` read from the body of the
one error shape (service/errors.py). Only error bodies are read, and they
are small; a successful answer costs a clock read and one observation.

The Kubernetes extender's and the Slurm filter's calls are observed a
second time under their own names (``verb``, ``call``), the latencies the
schedulers wait on.
"""

from __future__ import annotations

import time
from collections.abc import Collection

import orjson
from prometheus_client.metrics import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.direct_routes import route_path
from service.metrics.registry import NO_CODE, Metrics

UNMATCHED = "unmatched"
EXTENDER_PREFIX = "/k8s/v1/"
SLURM_PREFIX = "/v1/slurm/"
_MAX_ERROR_BODY = 64 * 1024  # an error body larger than this is not the error shape
# A client names the method: any other is counted as one, so it cannot add series.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def error_code(body: bytes) -> str:
    """The ``code`` of the one error shape; ``unknown`` for any other body."""
    try:
        found = orjson.loads(body)["error"]["code"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return "unknown"
    return found if isinstance(found, str) and len(found) <= 64 else "unknown"


class RequestMetrics:
    """ASGI middleware observing every HTTP request into ``metrics``."""

    def __init__(
        self, app: ASGIApp, metrics: Metrics, direct: Collection[tuple[str, str]] = ()
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.direct = frozenset(direct)  # (method, path) answered before the router
        # Label lookups cost more than the observation; each child is looked up once.
        self._children: dict[tuple[str, str, str, str], list[Histogram]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500  # what the fault barrier answers when nothing was sent
        error_body: list[bytes] | None = None

        async def observed_send(message: Message) -> None:
            nonlocal status, error_body
            if message["type"] == "http.response.start":
                status = message["status"]
                if status >= 400:
                    error_body = []
            elif (
                error_body is not None
                and message["type"] == "http.response.body"
                and sum(map(len, error_body)) < _MAX_ERROR_BODY
            ):
                error_body.append(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, observed_send)
        finally:
            code = NO_CODE if error_body is None else error_code(b"".join(error_body))
            elapsed = time.perf_counter() - started
            for histogram in self._observers(scope, status, code):
                histogram.observe(elapsed)

    def _observers(self, scope: Scope, status: int, code: str) -> list[Histogram]:
        method = scope["method"] if scope["method"] in METHODS else "other"
        route = scope.get("route")
        # The template without convertors ("{job_id}", not "{job_id:path}"): as the
        # OpenAPI document and the access table write it.
        template = getattr(route, "path_format", None) or getattr(route, "path", None)
        if template is None:
            path = route_path(scope)
            template = path if (method, path) in self.direct else UNMATCHED
        key = (template, method, f"{status // 100}xx", code)
        children = self._children.get(key)
        if children is None:
            children = [self.metrics.requests.labels(*key)]
            if template.startswith(EXTENDER_PREFIX):
                children.append(
                    self.metrics.extender.labels(template[len(EXTENDER_PREFIX) :], code)
                )
            elif template.startswith(SLURM_PREFIX):
                children.append(self.metrics.slurm.labels(template[len(SLURM_PREFIX) :], code))
            self._children[key] = children
        return children
