"""HTTP routes for nodes: thin, everything is in service.nodes.service."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Path, Query, Response, status

from placement.snapshot import NODE_NAME_PATTERN
from service.admin_actions import Caller
from service.deps import get_caller, get_state
from service.nodes import nvlink_report
from service.nodes import observed as service
from service.nodes.schemas import (
    HeartbeatReport,
    NodeKeyRegistration,
    NodeKeyView,
    NodeList,
    NodeView,
    NvlinkView,
    SnapshotAccepted,
    SnapshotReport,
    TopologyView,
)
from service.state import ServiceState

router = APIRouter(prefix="/v1/nodes", tags=["nodes"])
State = Annotated[ServiceState, Depends(get_state)]
Who = Annotated[Caller, Depends(get_caller)]
# As long as the database's column; control characters are refused by the request guard.
# gRPC bounds its node names by the same number (service/grpc/servicer.py).
MAX_NODE_NAME = 253
NodeName = Annotated[str, Path(min_length=1, max_length=MAX_NODE_NAME)]
# A key is registered only for a valid node name (register_key checks it); the document
# says so, as the snapshot's own name does.
NewNodeName = Annotated[
    str,
    Path(min_length=1, max_length=MAX_NODE_NAME, json_schema_extra={"pattern": NODE_NAME_PATTERN}),
]


@router.put("/{name}/snapshot", response_model=SnapshotAccepted)
def put_snapshot(
    name: NodeName, report: SnapshotReport, state: State, caller: Who
) -> SnapshotAccepted:
    """An agent reports its node's full snapshot (on start and whenever it changes), signed
    by the node's registered key (docs/security.md)."""
    return service.report_snapshot(state, name, report, caller)


@router.post("/{name}/heartbeat", status_code=status.HTTP_204_NO_CONTENT)
def post_heartbeat(
    name: NodeName,
    state: State,
    caller: Who,
    report: Annotated[HeartbeatReport | None, Body()] = None,
) -> Response:
    """The node is alive; the body, optional, carries its NVLink counters (docs/metrics.md)."""
    service.heartbeat_with(state, name, report, caller)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.put("/{name}/key", response_model=NodeKeyView)
def put_key(
    name: NewNodeName,
    key: NodeKeyRegistration,
    state: State,
    caller: Who,
    replace: Annotated[
        bool, Query(description="replace a different registered key (an admin action)")
    ] = False,
) -> NodeKeyView:
    """Register the Ed25519 public key a node signs snapshots with: an admin action, or its
    agent's on first use when the service trusts on first use (docs/security.md)."""
    return service.register_key(state, name, key, caller, replace=replace)


@router.get("/{name}/key", response_model=NodeKeyView)
def get_key(name: NodeName, state: State) -> NodeKeyView:
    return service.get_key(state, name)


@router.delete("/{name}/key", status_code=status.HTTP_204_NO_CONTENT)
def delete_key(name: NodeName, state: State, caller: Who) -> Response:
    """Forget a node's key, so that a new one (a reinstalled node) can be registered (an
    admin action)."""
    service.delete_key(state, name, caller)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("", response_model=NodeList)
def list_nodes(state: State) -> NodeList:
    return NodeList(nodes=service.list_nodes(state))


@router.get("/{name}", response_model=NodeView)
def get_node(name: NodeName, state: State) -> NodeView:
    return service.get_node(state, name)


@router.get("/{name}/topology", response_model=TopologyView)
def get_topology(name: NodeName, state: State) -> TopologyView:
    """The link matrix, its bandwidths, and the same as `nvidia-smi topo -m` text."""
    return service.topology(state, name)


@router.get("/{name}/nvlink", response_model=NvlinkView)
def get_nvlink(name: NodeName, state: State) -> NvlinkView:
    """The node's latest NVLink counters, per GPU and link, as its agent last reported them."""
    return nvlink_report.view(state, name)


@router.get("/{name}/snapshots")
def get_snapshots(name: NodeName, state: State) -> list[dict[str, Any]]:
    """Stored snapshot history, newest first (bounded by TOPOPLACE_SNAPSHOT_HISTORY)."""
    return service.snapshot_history(state, name)


@router.post("/{name}/cordon", response_model=NodeView)
def cordon(name: NodeName, state: State) -> NodeView:
    return service.set_cordoned(state, name, True)


@router.post("/{name}/uncordon", response_model=NodeView)
def uncordon(name: NodeName, state: State) -> NodeView:
    return service.set_cordoned(state, name, False)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_node(name: NodeName, state: State) -> Response:
    service.remove_node(state, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
