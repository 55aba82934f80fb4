"""GET /metrics: the Prometheus text format, open to every caller (service/access.py).

One process (``topoplace serve``): the service's own counters and
histograms (registry.py) and the state read at scrape time (cluster.py).
Several worker processes behind one port (a process manager running
``service.app:create_app`` with ``PROMETHEUS_MULTIPROC_DIR`` set to an empty
directory before any worker starts): each worker's counters and histograms
are written to that directory, and whichever worker answers adds them all
up; the state gauges come from that worker's own state, which every worker
loads from the same database.
"""

from __future__ import annotations

import os

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

from service.metrics.cluster import ClusterCollector
from service.state import ServiceState

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
router = APIRouter(tags=["metrics"])
_TEXT = {"content": {"text/plain": {"schema": {"type": "string"}}}}


def exposition(state: ServiceState) -> CollectorRegistry:
    """The registry /metrics writes out, built once per service (create_app)."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = state.metrics.registry
    registry.register(ClusterCollector(state))
    return registry


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"description": "the Prometheus text exposition format", **_TEXT}},
)
def metrics(request: Request) -> Response:
    """Every metric docs/metrics.md lists, in the Prometheus text format."""
    registry: CollectorRegistry = request.app.state.exposition
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
