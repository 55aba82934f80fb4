"""The node operations as both transports call them: the service layer, plus
one event per change for watchers (service/events.py).

Heartbeats are not events: thousands of nodes send one every few seconds,
and a heartbeat changes nothing a watcher acts on (staleness shows in the
node's ``state`` when it is read).
"""

from __future__ import annotations

from service.admin_actions import INTERNAL, Caller
from service.errors import ServiceError
from service.nodes import nvlink_report, service
from service.nodes.schemas import HeartbeatReport, NodeView, SnapshotAccepted, SnapshotReport
from service.nodes.service import (
    delete_key,
    get_key,
    get_node,
    heartbeat,
    list_nodes,
    register_key,
    snapshot_history,
    topology,
)
from service.state import ServiceState

__all__ = [
    "delete_key",
    "get_key",
    "get_node",
    "heartbeat",
    "heartbeat_with",
    "list_nodes",
    "register_key",
    "remove_node",
    "report_snapshot",
    "set_cordoned",
    "snapshot_history",
    "topology",
]


def report_snapshot(
    state: ServiceState, name: str, report: SnapshotReport, caller: Caller = INTERNAL
) -> SnapshotAccepted:
    try:
        accepted = service.report_snapshot(state, name, report, caller)
    except ServiceError as refused:  # one that did not parse is counted at the edge
        state.metrics.snapshot_refusals.labels(refused.code).inc()
        raise
    state.metrics.snapshots.labels("true" if accepted.changed else "false").inc()
    if accepted.changed:
        state.events.publish("node", "reported", node=name)
    return accepted


def heartbeat_with(
    state: ServiceState, name: str, report: HeartbeatReport | None, caller: Caller = INTERNAL
) -> None:
    """A heartbeat, with the NVLink counters it may carry (checked first, kept after)."""
    links = nvlink_report.check(state, name, report) if report is not None else ()
    heartbeat(state, name, caller)
    if report is not None:
        nvlink_report.keep(state, name, links)


def set_cordoned(state: ServiceState, name: str, cordoned: bool) -> NodeView:
    view = service.set_cordoned(state, name, cordoned)
    state.events.publish("node", "cordoned" if cordoned else "uncordoned", node=name)
    return view


def remove_node(state: ServiceState, name: str) -> None:
    service.remove_node(state, name)
    state.nvlink.forget(name)
    state.events.publish("node", "removed", node=name)
