"""Bind: reserve the pod's GPUs on the chosen node, then create the Binding naming them.

Order matters. The reservation comes first (the database refuses a GPU held
twice), then the Binding; if the Binding fails the reservation is released,
so a pod never runs on GPUs nobody holds and GPUs are never held for a pod
that did not bind. A pod's reservation is made active at once (one database
transaction on the bind's path, not a pending one and then a confirm): if
the Binding fails it is released here, and if the process dies between the
two, the reconciler releases it once its pod is still unbound after the
grace. A gang's reservation is pending until its first member binds.

Retries never double-book: a pod's reservations carry its UID as job id and
an Idempotency-Key made of the UID and the number of reservations it had
before, so a repeated bind (a scheduler retry after a timeout) replays the
same reservation, and a bind to another node after a failed attempt
releases the old one first.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from service.allocations import api as allocations
from service.allocations.results import Allocation, TaskPlan
from service.allocations.schemas import PlaceRequest
from service.errors import Conflict, ServiceError
from service.event_loop import off_loop
from service.flows import Flow, drive, drive_async
from service.k8s.gang import LIVE, TASK_ANNOTATION, BindRefused, GangCoordinator
from service.k8s.kube_api import KubeApi, KubeApiError
from service.k8s.pod_request import PodRequest
from service.k8s.screening import PREFIX
from service.k8s.timed_api import TimedKubeApi
from service.state import ServiceState

log = logging.getLogger("topoplace.k8s")

GPUS_ANNOTATION = "topoplace.io/gpus"
INDICES_ANNOTATION = "topoplace.io/gpu-indices"
ALLOCATION_ANNOTATION = "topoplace.io/allocation"
CPUSET_ANNOTATION = "topoplace.io/cpuset"


def binding_annotations(allocation: Allocation, tasks: Sequence[TaskPlan]) -> dict[str, str]:
    """What the Binding (and so the pod) carries: the devices by UUID and by index."""
    devices = [d for t in tasks for d in t.devices]
    indices = sorted({i for t in tasks for i in t.gpu_indices})
    notes = {
        GPUS_ANNOTATION: ",".join(devices),
        INDICES_ANNOTATION: ",".join(str(i) for i in indices),
        ALLOCATION_ANNOTATION: allocation.id,
    }
    cpusets = [t.cpuset for t in tasks if t.cpuset]
    if cpusets:
        notes[CPUSET_ANNOTATION] = ",".join(cpusets)
    return notes


def _already_bound(kube: KubeApi, pod: PodRequest, node: str) -> bool:
    """A 409 from the API server after a retried bind: is the pod on this node already?"""
    try:
        current = kube.get_pod(pod.namespace, pod.name)
    except KubeApiError:
        return False
    return current is not None and (current.get("spec") or {}).get("nodeName") == node


def _refusal(exc: KubeApiError, node: str) -> str:
    """What a failed Binding says to kube-scheduler."""
    if exc.status == 0:  # nothing answered: say which server, not that it refused
        return (
            f"{PREFIX}the Kubernetes API server did not answer the binding to {node}"
            f" ({exc.message}); check that it is reachable from the service"
        )
    return f"{PREFIX}the Kubernetes API refused the binding to {node}: {exc.message}"


def create_binding(kube: KubeApi, pod: PodRequest, node: str, notes: dict[str, str]) -> str | None:
    """Create the Binding; None when done, else why not."""
    try:
        kube.bind(pod.namespace, pod.name, pod.uid, node, notes)
    except KubeApiError as exc:
        if exc.status == 409 and _already_bound(kube, pod, node):
            return None
        return _refusal(exc, node)
    return None


async def create_binding_async(
    kube: TimedKubeApi, pod: PodRequest, node: str, notes: dict[str, str]
) -> str | None:
    """``create_binding`` on the event loop (the rare 409's read on a worker thread)."""
    try:
        await kube.bind_async(pod.namespace, pod.name, pod.uid, node, notes)
    except KubeApiError as exc:
        if exc.status == 409 and await off_loop(_already_bound, kube, pod, node):
            return None
        return _refusal(exc, node)
    return None


@dataclass(frozen=True, slots=True)
class Post:
    """A step of the bind's flow: the pod's Binding, with these annotations."""

    pod: PodRequest
    node: str
    notes: dict[str, str]


def _confirm(state: ServiceState, allocation: Allocation) -> Allocation:
    """The allocation confirmed; as it was when the confirm failed."""
    try:
        return allocations.confirm(state, allocation.id)
    except ServiceError as exc:
        # Still pending: the reconciler confirms it once it sees the pod bound.
        log.warning("allocation %s stays pending: %s", allocation.id, exc.message)
        return allocation


def _first_reservation(
    state: ServiceState, body: PlaceRequest, pod: PodRequest
) -> Flow[Allocation | None]:
    """The usual bind, the pod's first: reserved under key N=0 with no read before it.

    None when the pod had a reservation before (the key's unique index says so at the
    commit: the replay, or a Conflict when that one was for another node); the caller
    then takes the careful path over the pod's earlier reservations.
    """
    try:
        placed = yield from allocations.placing(state, body, f"k8s-pod:{pod.uid}:0", True, False)
    except Conflict:
        return None
    return placed.allocation if placed.created else None


def _reservation(state: ServiceState, body: PlaceRequest, pod: PodRequest, node: str) -> Allocation:
    """A retried or moved bind: reuse the live reservation on ``node``, give back those
    on other nodes, or reserve under the next key."""
    earlier = allocations.listing(state, pod.uid, None, None, 1_000)
    live = [a for a in earlier if a.state in LIVE]
    here = next((a for a in live if a.tasks[0].node == node), None)
    for stale in live:
        if stale is not here:  # an earlier attempt on another node failed; give those back
            allocations.release(state, stale.id)
    if here is not None:
        return here
    return allocations.place(state, body, f"k8s-pod:{pod.uid}:{len(earlier)}", True).allocation


def _bind_flow(state: ServiceState, pod: PodRequest, node: str, ttl_s: float) -> Flow[str]:
    """One pod's GPUs on ``node``, then its Binding: ExtenderBindingResult.Error ('' when
    bound). A flow (service/flows.py) of the reservation's steps, a ``Post`` and the
    rare blocking steps, driven on a worker thread (``bind_pod``) or on the event loop
    (``bind_pod_async``)."""
    if pod.request is None:
        return (yield Post(pod, node, {})) or ""
    body = PlaceRequest.model_validate(
        {
            **pod.request.model_dump(),
            "nodes": [node],
            "job_id": pod.uid,
            "owner": pod.owner,
            "ttl_s": ttl_s,
        }
    )
    try:
        allocation = yield from _first_reservation(state, body, pod)
        if allocation is None:
            allocation = yield functools.partial(_reservation, state, body, pod, node)
    except ServiceError as exc:
        return f"{PREFIX}cannot reserve GPUs on {node}: {exc.message}"
    refused = yield Post(pod, node, binding_annotations(allocation, allocation.tasks))
    if refused is not None:
        yield functools.partial(allocations.release, state, allocation.id)
        return str(refused)
    if allocation.state == "pending":
        yield functools.partial(_confirm, state, allocation)
    return ""


def bind_pod(state: ServiceState, kube: KubeApi, pod: PodRequest, node: str, ttl_s: float) -> str:
    """``_bind_flow`` blocking on each step (a worker thread). The reservation is written
    on this thread where the database is free, without the hand-over to the group
    committer: kube-scheduler waits on each bind."""

    def step(request: object) -> object:
        if isinstance(request, Post):
            return create_binding(kube, request.pod, request.node, request.notes)
        return allocations.run_step(state, cast(allocations.Step, request), at_once=True)

    return drive(_bind_flow(state, pod, node, ttl_s), step)


async def bind_pod_async(
    state: ServiceState, kube: TimedKubeApi, pod: PodRequest, node: str, ttl_s: float
) -> str:
    """``_bind_flow`` on the event loop: the Binding awaited, the reservation written at
    once on SQLite (as the Slurm filter's, service/event_loop.py) or awaited from the
    group committer, and only the rare steps (a retried bind's read, a release after a
    refused Binding) on a worker thread."""

    async def step(request: object) -> object:
        if isinstance(request, Post):
            return await create_binding_async(kube, request.pod, request.node, request.notes)
        return await allocations.await_step(state, cast(allocations.Step, request), at_once=True)

    return await drive_async(_bind_flow(state, pod, node, ttl_s), step)


def bind_gang_member(
    state: ServiceState,
    kube: KubeApi,
    gangs: GangCoordinator,
    pod: PodRequest,
    node: str,
    ttl_s: float,
) -> str:
    """A gang member: the gang's reservation first (all of it), then this member's task."""
    assert pod.gang is not None
    with gangs.lock(pod.gang):
        try:
            allocation, task = gangs.claim(pod, node, ttl_s)
        except BindRefused as exc:
            return str(exc)
        notes = binding_annotations(allocation, [allocation.tasks[task]])
        notes[TASK_ANNOTATION] = str(task)
        refused = create_binding(kube, pod, node, notes)
        if refused is not None:
            gangs.unclaim(pod, task)  # the gang keeps its reservation for its members
            return refused
        if allocation.state == "pending":
            gangs.update(pod.gang, _confirm(state, allocation))
    return ""
