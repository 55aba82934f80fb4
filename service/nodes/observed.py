"""The node operations as both transports call them: the service layer, plus
one event per change for watchers (service/events.py).

Heartbeats are not events: thousands of nodes send one every few seconds,
and a heartbeat changes nothing a watcher acts on (staleness shows in the
node's ``state`` when it is read).
"""

from __future__ import annotations

from service.admin_actions import INTERNAL, Caller
from service.nodes import service
from service.nodes.schemas import NodeView, SnapshotAccepted, SnapshotReport
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
    accepted = service.report_snapshot(state, name, report, caller)
    if accepted.changed:
        state.events.publish("node", "reported", node=name)
    return accepted


def set_cordoned(state: ServiceState, name: str, cordoned: bool) -> NodeView:
    view = service.set_cordoned(state, name, cordoned)
    state.events.publish("node", "cordoned" if cordoned else "uncordoned", node=name)
    return view


def remove_node(state: ServiceState, name: str) -> None:
    service.remove_node(state, name)
    state.events.publish("node", "removed", node=name)
