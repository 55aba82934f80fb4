"""NVLink counters sent with a heartbeat: checked against the node, kept, and read back.

The report is checked as a whole before anything is kept: a link on a GPU
the node's stored snapshot does not have is refused (422 ``invalid_request``
naming the entry), and the heartbeat it came with is refused with it, so an
agent that sends nonsense hears of it rather than having half of it kept.
"""

from __future__ import annotations

import json

import sqlalchemy as sa

from service import schema
from service.errors import InvalidRequest, NotFound
from service.nodes.nvlink import LinkCounters, NodeTelemetry
from service.nodes.schemas import HeartbeatReport, NvlinkCounters, NvlinkView
from service.state import ServiceState


def _stored_gpu_count(state: ServiceState, name: str) -> int | None:
    """The GPU count of the node's stored snapshot (None: no such node; the heartbeat
    answers 404)."""
    with state.engine.connect() as conn:
        body = conn.execute(
            sa.select(schema.nodes.c.snapshot).where(schema.nodes.c.name == name)
        ).scalar_one_or_none()
    if body is None:
        return None
    try:
        stored = json.loads(body)
    except ValueError:
        return 0  # a row that is no snapshot's JSON (service/nodes/loadable.py): no GPU
    gpus = stored.get("gpus") if isinstance(stored, dict) else None
    return len(gpus) if isinstance(gpus, list) else 0


def _gpu_count(state: ServiceState, name: str, report: HeartbeatReport) -> int | None:
    """The node's GPU count: memory's, unless memory lacks the node or the report names a
    GPU past it. A replica behind (the node not loaded yet, or grown since) then asks the
    database: memory alone accepted any index for a node it had not loaded and refused
    every heartbeat of a node that gained GPUs until it heard of the new snapshot."""
    with state.lock:
        gpus = state.cluster.node(name).snapshot.gpu_count if name in state.cluster else None
    highest = max((entry.gpu for entry in report.nvlink), default=-1)
    if highest < 0 or (gpus is not None and highest < gpus):
        return gpus
    return _stored_gpu_count(state, name)


def check(state: ServiceState, name: str, report: HeartbeatReport) -> tuple[LinkCounters, ...]:
    """The report's links, once each names a GPU the node has (InvalidRequest if not)."""
    gpus = _gpu_count(state, name, report)
    links = []
    for i, entry in enumerate(report.nvlink):
        if gpus is not None and entry.gpu >= gpus:
            has = f"{gpus} GPUs (indexes 0-{gpus - 1})" if gpus else "no GPU the service can read"
            raise InvalidRequest(
                f"nvlink.{i}.gpu", f"node {name!r} has {has}; GPU {entry.gpu} is not one of them"
            )
        links.append(LinkCounters(**entry.model_dump()))
    return tuple(sorted(links, key=lambda c: (c.gpu, c.link)))


def keep(state: ServiceState, name: str, links: tuple[LinkCounters, ...]) -> bool:
    """Keep the node's reading (after its heartbeat was taken); False when dropped as
    too soon after the last one (nvlink.py)."""
    kept = state.nvlink.offer(NodeTelemetry(name, state.clock(), links))
    state.metrics.telemetry.labels("stored" if kept else "too_soon").inc()
    return kept


def view(state: ServiceState, name: str) -> NvlinkView:
    with state.lock:
        known = name in state.cluster
    if not known:
        raise NotFound(f"no node named {name!r}")
    reading = state.nvlink.get(name)
    if reading is None:
        return NvlinkView(node=name, at=None, links=[])
    links = [NvlinkCounters.model_validate(c, from_attributes=True) for c in reading.links]
    return NvlinkView(node=name, at=reading.at, links=links)
