"""NVLink counters sent with a heartbeat: checked against the node, kept, and read back.

The report is checked as a whole before anything is kept: a link on a GPU
the node's snapshot does not have is refused (422 ``invalid_request``
naming the entry), and the heartbeat it came with is refused with it, so an
agent that sends nonsense hears of it rather than having half of it kept.
"""

from __future__ import annotations

from service.errors import InvalidRequest, NotFound
from service.nodes.nvlink import LinkCounters, NodeTelemetry
from service.nodes.schemas import HeartbeatReport, NvlinkCounters, NvlinkView
from service.state import ServiceState


def check(state: ServiceState, name: str, report: HeartbeatReport) -> tuple[LinkCounters, ...]:
    """The report's links, once each names a GPU the node has (InvalidRequest if not)."""
    with state.lock:
        gpus = state.cluster.node(name).snapshot.gpu_count if name in state.cluster else None
    links = []
    for i, entry in enumerate(report.nvlink):
        if gpus is not None and entry.gpu >= gpus:
            raise InvalidRequest(
                f"nvlink.{i}.gpu",
                f"node {name!r} has {gpus} GPUs (indexes 0-{gpus - 1}); GPU {entry.gpu}"
                " is not one of them",
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
