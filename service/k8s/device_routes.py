"""HTTP routes of the device plugin (``topoplace device-plugin``) and of `topoplace k8s reconcile`.

``GET /v1/nodes/{name}/k8s/reservations`` and ``POST /v1/nodes/{name}/k8s/devices``
are the node's own business: an agent token scoped to the node may call them
(the plugin runs beside the agent, with its token). ``GET /v1/k8s/mismatches``
is a read.
"""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from service.admin_actions import Caller
from service.deps import get_caller, get_state
from service.k8s import node_devices
from service.k8s.device_schemas import (
    DeviceReport,
    DeviceReportResult,
    Mismatches,
    NodeReservations,
)
from service.k8s.extender import Extender
from service.k8s.report_order import NodeLocks
from service.state import ServiceState

router = APIRouter(tags=["kubernetes"])
State = Annotated[ServiceState, Depends(get_state)]
Who = Annotated[Caller, Depends(get_caller)]
NodeName = Annotated[str, Path(min_length=1, max_length=253)]
_CREATE = threading.Lock()


def _mismatches(request: Request) -> node_devices.MismatchLog:
    """The application's difference log, since it started (one per app, not per process)."""
    with _CREATE:  # the routes run on worker threads: one log, whoever comes first
        found: node_devices.MismatchLog | None = getattr(request.app.state, "k8s_mismatches", None)
        if found is None:
            found = node_devices.MismatchLog()
            request.app.state.k8s_mismatches = found
        return found


def _locks(request: Request) -> NodeLocks:
    """The application's per-node locks over device reports."""
    with _CREATE:
        found: NodeLocks | None = getattr(request.app.state, "k8s_report_locks", None)
        if found is None:
            found = NodeLocks()
            request.app.state.k8s_report_locks = found
        return found


@router.get("/v1/nodes/{name}/k8s/reservations", response_model=NodeReservations)
def get_reservations(name: NodeName, state: State) -> NodeReservations:
    """The live reservations the extender made for pods on this node, oldest first: what the
    device plugin matches a kubelet admission against (docs/kubernetes.md)."""
    return NodeReservations(node=name, reservations=node_devices.reservations(state, name))


@router.post("/v1/nodes/{name}/k8s/devices", response_model=DeviceReportResult)
def post_devices(
    name: NodeName, body: DeviceReport, state: State, request: Request, caller: Who
) -> DeviceReportResult:
    """What the kubelet really allocated to each pod on this node (its PodResources List):
    each pod's allocation is kept, moved onto those GPUs or created; every difference is
    counted (``GET /v1/k8s/mismatches``)."""
    extender: Extender = request.app.state.k8s
    log = _mismatches(request)
    # The caller: a region-scoped agent's report is taken only while the database, not
    # this replica's memory, holds the node in its region (node_devices.report).
    locks = _locks(request)
    # Who may report it, before anything: a node topoplace does not know gets no lock
    # (the locks are one per node known, not one per name a caller sends).
    node_devices.check_scope(state, name, caller)
    # One node's reports in turn on this replica; their order across replicas is the
    # database's (node_devices.report).
    with locks.node_lock(name):
        outcomes = node_devices.report(state, extender.kube, name, body, log, caller)
    return DeviceReportResult(node=name, outcomes=outcomes, mismatches=log.counts_of(name))


@router.get("/v1/k8s/mismatches", response_model=Mismatches)
def get_mismatches(request: Request) -> Mismatches:
    """How often, and for which pods, the kubelet allocated other devices than reserved."""
    return _mismatches(request).view()
