"""Bind: reserve the pod's GPUs on the chosen node, then create the Binding naming them.

Order matters. The reservation comes first (the database refuses a GPU held
twice), then the Binding; if the API server refuses the Binding the
reservation is released, so a pod never runs on GPUs nobody holds and GPUs
are never held for a pod that did not bind. A Binding whose fate is unknown
(no answer, a server error) keeps its reservation unless a read of the pod
settles it (``Refused``): it may have been applied. A pod's reservation is
made active at once (one database transaction on the bind's path, not a
pending one and then a confirm); if the process dies between the two, the
reconciler releases it once its pod is still unbound after the grace. A
gang's reservation is pending until its first member binds.

Retries never double-book: a pod's reservations carry its UID as job id and
an Idempotency-Key made of the UID and the number of reservations it had
before, so a repeated bind (a scheduler retry after a timeout) replays the
same reservation, and a bind to another node after a failed attempt gives
the old one back once its own Binding is made.
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
from service.edge import revoked_meanwhile
from service.errors import Conflict, ServiceError
from service.event_loop import off_loop
from service.flows import Flow, drive, drive_async
from service.k8s.gang import LIVE, TASK_ANNOTATION, BindRefused, GangCoordinator, GangUnread
from service.k8s.kube_api import KubeApi, KubeApiError
from service.k8s.pod_request import PodRequest
from service.k8s.screening import PREFIX
from service.k8s.timed_api import TimedKubeApi
from service.state import ServiceState
from service.tokens.presented import Unauthorized

log = logging.getLogger("topoplace.k8s")

GPUS_ANNOTATION = "topoplace.io/gpus"
INDICES_ANNOTATION = "topoplace.io/gpu-indices"
ALLOCATION_ANNOTATION = "topoplace.io/allocation"
CPUSET_ANNOTATION = "topoplace.io/cpuset"
FINISHED = ("Succeeded", "Failed")


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


def _bound_here(kube: KubeApi, pod: PodRequest, node: str) -> bool | None:
    """Whether this pod is bound to ``node``, as the API server has it now: this pod,
    by UID (a pod deleted and made again under its name is another pod, whose node says
    nothing of this one's Binding); None when the pod cannot be read."""
    try:
        current = kube.get_pod(pod.namespace, pod.name)
    except KubeApiError:
        return None
    if current is None:
        return False
    if pod.uid and (current.get("metadata") or {}).get("uid") != pod.uid:
        return False
    if (current.get("status") or {}).get("phase") in FINISHED:
        # Bound here once and finished since (a retry come after the pod's end): it runs
        # on nothing, so what this bind reserved again goes back now.
        return False
    return (current.get("spec") or {}).get("nodeName") == node


@dataclass(frozen=True, slots=True)
class Refused:
    """A Binding not made, or not known to be: what kube-scheduler is told, and whether
    the API server's answer settles that the pod is not bound to the node.

    Only a settled refusal gives the reservation back. With no answer (a timeout, a
    connection reset after the request went out) or a server error the Binding may
    have been applied, or may still be: the pod may run on those GPUs, so they stay
    held. A retried bind of the pod replays the reservation, and the reconciler
    releases it if the pod is still unbound after its grace (reconcile.py)."""

    message: str
    settled: bool


def _unsure(exc: KubeApiError) -> bool:
    """An answer that leaves the Binding's fate to a read of the pod: 409 (already bound:
    by this bind's earlier try, or another), no answer, or a server error."""
    return exc.status in (0, 409) or exc.status >= 500


def _judged(exc: KubeApiError, node: str, bound: bool | None) -> Refused | None:
    """The outcome of a failed POST, given the pod's read (None: not read, or unreadable)."""
    if bound:
        return None  # the pod is on the node: a retried bind, or an answer that was lost
    # 409: bound elsewhere, or another pod under the name, settles it; else only a
    # refusal the server answered (4xx) does: it wrote nothing.
    settled = bound is False if exc.status == 409 else 400 <= exc.status < 500
    return Refused(_refusal(exc, node), settled)


def _refusal(exc: KubeApiError, node: str) -> str:
    """What a failed Binding says to kube-scheduler."""
    if exc.status == 0:  # nothing answered: say which server, not that it refused
        return (
            f"{PREFIX}the Kubernetes API server did not answer the binding to {node}"
            f" ({exc.message}); check that it is reachable from the service"
        )
    return f"{PREFIX}the Kubernetes API refused the binding to {node}: {exc.message}"


def create_binding(
    kube: KubeApi, pod: PodRequest, node: str, notes: dict[str, str]
) -> Refused | None:
    """Create the Binding; None when done, else why not."""
    try:
        kube.bind(pod.namespace, pod.name, pod.uid, node, notes)
    except KubeApiError as exc:
        return _judged(exc, node, _bound_here(kube, pod, node) if _unsure(exc) else None)
    return None


async def create_binding_async(
    kube: TimedKubeApi, pod: PodRequest, node: str, notes: dict[str, str]
) -> Refused | None:
    """``create_binding`` on the event loop (the rare read of the pod on a worker thread)."""
    try:
        await kube.bind_async(pod.namespace, pod.name, pod.uid, node, notes)
    except KubeApiError as exc:
        bound = await off_loop(_bound_here, kube, pod, node) if _unsure(exc) else None
        return _judged(exc, node, bound)
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


def _reservation(
    state: ServiceState, body: PlaceRequest, pod: PodRequest, node: str
) -> tuple[Allocation, list[str]]:
    """A retried or moved bind: the live reservation on ``node`` reused, or one made under
    the next key; and the pod's reservations on other nodes, given back once this
    Binding is made. Not before: an earlier bind to another node may still be in
    flight, and if its Binding lands first the pod runs on that reservation's GPUs
    (this one's Binding then gets 409 and gives back its own).

    The reservation reused is stamped first (``allocations.touch``): a reconciler pass
    that read the pod unbound before this Binding then leaves it (reconcile.py). One
    that ended meanwhile (that pass released it) is not reused: the pod reserves anew."""
    # Its newest: the live ones are among them.
    earlier = allocations.listing(state, pod.uid, None, None, 1_000)
    live = [a for a in earlier if a.state in LIVE]
    here = next((a for a in live if a.tasks[0].node == node), None)
    elsewhere = [a.id for a in live if a is not here]
    if here is not None:
        touched = allocations.touch(state, here.id)
        if touched is not None:
            return touched, elsewhere
    # The next key: counted, not listed (a listing is capped, and a key counted short
    # replays an ended reservation, whose GPUs the Binding would then name unheld).
    key = f"k8s-pod:{pod.uid}:{allocations.count_for_job(state, pod.uid)}"
    placed = allocations.place(state, body, key, True)
    if not placed.created and placed.allocation.state not in LIVE:
        # The key's reservation ended (a racing bind's, given back): none is held here.
        raise Conflict(f"the pod's reservation under {key} has ended; bind it again")
    return placed.allocation, elsewhere


def _give_back(state: ServiceState, allocation_ids: list[str]) -> None:
    """Release the pod's reservations on nodes it was not bound to (ended ones: no-ops)."""
    for allocation_id in allocation_ids:
        allocations.release(state, allocation_id)


def _revoked_meanwhile() -> str | None:
    """ExtenderBindingResult.Error when the caller's token was revoked since its request
    was let in (a read of the pod from the API server, a wait on the gang's lock come
    before this): nothing is then reserved or bound (service/edge/revoked_meanwhile.py)."""
    refused = revoked_meanwhile.refusal()
    return None if refused is None else PREFIX + refused.message


def _bind_flow(state: ServiceState, pod: PodRequest, node: str, ttl_s: float) -> Flow[str]:
    """One pod's GPUs on ``node``, then its Binding: ExtenderBindingResult.Error ('' when
    bound). A flow (service/flows.py) of the reservation's steps, a ``Post`` and the
    rare blocking steps, driven on a worker thread (``bind_pod``) or on the event loop
    (``bind_pod_async``)."""
    revoked = _revoked_meanwhile()  # a pod without GPUs is bound with no reservation's check
    if revoked is not None:
        return revoked
    if pod.request is None:
        unbound: Refused | None = yield Post(pod, node, {})
        return "" if unbound is None else unbound.message
    body = PlaceRequest.model_validate(
        {
            **pod.request.model_dump(),
            "nodes": [node],
            "job_id": pod.uid,
            "owner": pod.owner,
            "ttl_s": ttl_s,
        }
    )
    elsewhere: list[str] = []
    try:
        allocation = yield from _first_reservation(state, body, pod)
        if allocation is None:
            allocation, elsewhere = yield functools.partial(_reservation, state, body, pod, node)
    except ServiceError as exc:
        return f"{PREFIX}cannot reserve GPUs on {node}: {exc.message}"
    refused: Refused | None = yield Post(
        pod, node, binding_annotations(allocation, allocation.tasks)
    )
    if refused is not None:
        if refused.settled:
            yield functools.partial(allocations.release, state, allocation.id)
        return refused.message
    if elsewhere:
        yield functools.partial(_give_back, state, elsewhere)
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
        # After the wait for the lock: a member's claim reuses the gang's reservation,
        # with no reservation's own check of the token on the way to its Binding.
        revoked = _revoked_meanwhile()
        if revoked is not None:
            return revoked
        try:
            allocation, task = gangs.claim(pod, node, ttl_s)
        except BindRefused as exc:
            return str(exc)
        except Unauthorized as exc:  # revoked during the claim: its stamp refused it
            return PREFIX + exc.message
        except GangUnread as exc:  # kube-scheduler binds again later, and it is read again
            return PREFIX + str(exc)
        notes = binding_annotations(allocation, [allocation.tasks[task]])
        notes[TASK_ANNOTATION] = str(task)
        refused = create_binding(kube, pod, node, notes)
        if refused is not None:
            if refused.settled:  # else the member may run on the task: it stays claimed
                gangs.unclaim(pod, task)  # the gang keeps its reservation for its members
            return refused.message
        if allocation.state == "pending":
            gangs.update(pod.gang, _confirm(state, allocation))
    return ""
