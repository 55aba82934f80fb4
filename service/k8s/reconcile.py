"""Give back the GPUs of pods that are gone or finished; confirm those that bound.

Every ``reconcile_interval_s`` the reconciler reads the live reservations the
extender made (owner ``k8s-pod:...`` or ``k8s-gang:...``), then lists the
pods that have not finished, in that order: a reservation read before the
list belongs to a pod that existed before it, so a live pod is never missed.
A pod's reservation is released when no unfinished pod has its UID, or
when its pod is still unbound (the bind reserved, then died before the
Binding, or its Binding's fate was unknown and it was not applied) or bound to
another node; a gang's when none of its members is left. Reservations made or
reused (a retried bind, a member's claim: ``allocations.touch``) within
``reconcile_grace_s`` before the pod list was asked for are left alone (their
bind may still be running), a condition each release checks in its own
statement, so a bind that reuses a reservation while the pass works from an
older list keeps it, whichever replica runs either; and
a pending reservation whose pod is bound to its node, or a pending gang
reservation a bound member carries, is confirmed (the bind could not confirm
it, e.g. the database blinked).

With the pod watch on (pod_watch.py) the reconciler is its backstop: what
it still finds to release is what no watch saw (a pod deleted while no
replica was watching, a bind that reserved but never reached its pod). It
counts those (:class:`Backstop`, on /readyz) and says so in the log.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from service.allocations import api as allocations
from service.allocations.results import Allocation
from service.audit.actor import acting, service_task
from service.event_loop import off_loop
from service.k8s.bind import ALLOCATION_ANNOTATION
from service.k8s.gang import GangCoordinator
from service.k8s.kube_api import KubeApi
from service.k8s.pod_request import gang_of
from service.state import ServiceState

log = logging.getLogger("topoplace.k8s")
RECONCILER = service_task("kubernetes reconciler")

POD_OWNER = "k8s-pod:"
GANG_OWNER = "k8s-gang:"


def _ours(state: ServiceState) -> list[Allocation]:
    """Every live reservation the extender made, however many others are live."""
    return [
        a for a in allocations.live(state) if (a.owner or "").startswith((POD_OWNER, GANG_OWNER))
    ]


def _gang_members(pods: list[dict[str, Any]]) -> tuple[set[str], set[str]]:
    """The gangs (keys) with an unfinished member, and the reservations (ids) a bound
    member carries."""
    alive: set[str] = set()
    bound: set[str] = set()
    for pod in pods:
        gang = gang_of(pod)
        if gang is None:
            continue
        alive.add(gang.key)
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        if (pod.get("spec") or {}).get("nodeName") and notes.get(ALLOCATION_ANNOTATION):
            bound.add(str(notes[ALLOCATION_ANNOTATION]))
    return alive, bound


def reconcile_once(
    state: ServiceState, kube: KubeApi, gangs: GangCoordinator, grace_s: float
) -> list[str]:
    """One pass; returns the ids of the reservations released."""
    ours = _ours(state)
    if not ours:
        return []
    # The pod list is no newer than this moment: a bind may have reused a reservation
    # just before it and still be writing its Binding, so only what was neither made
    # nor reused (allocations.touch) in the grace before it is released, and that is
    # checked by each release itself, however long the pass takes.
    cutoff = state.clock() - timedelta(seconds=grace_s)
    pods = kube.list_pods()
    by_uid = {str((p.get("metadata") or {}).get("uid", "")): p for p in pods}
    gangs_alive, gangs_bound = _gang_members(pods)

    def release(allocation_id: str, ended_job: str | None = None) -> tuple[str, ...]:
        return allocations.release(state, allocation_id, quiet=cutoff, ended_job=ended_job).ids

    released: list[str] = []
    for allocation in ours:
        young = allocation.created_at > cutoff
        if (allocation.owner or "").startswith(GANG_OWNER):
            key = str(allocation.job_id)
            if key not in gangs_alive:
                ended = () if young else release(allocation.id)
                if ended:
                    released += ended
                    gangs.forget(key)
            elif allocation.state == "pending" and allocation.id in gangs_bound:
                # A member runs on it, and every bind's confirm failed (the database
                # blinked): left pending, its TTL would end it under its members.
                allocations.confirm(state, allocation.id)
            continue
        pod = by_uid.get(str(allocation.job_id))
        if pod is None:
            if not young:
                # No unfinished pod has its UID: the pod ended. Said as the end of that
                # UID, as the watch says it: a device report that read the pod running
                # and is taken after this then writes nothing for it (before, it made the
                # gone pod an allocation on its old GPUs and released their new holder).
                released += release(allocation.id, ended_job=str(allocation.job_id))
            continue
        bound_to = (pod.get("spec") or {}).get("nodeName")
        notes = (pod.get("metadata") or {}).get("annotations") or {}
        if not young and bound_to != allocation.tasks[0].node:
            # Reserved (active at once) but the Binding never happened: the process died
            # between the two, and the pod's next bind reserves again. Or the pod was
            # bound to another node (a retried bind there, whose process died before it
            # gave this one back): nothing will ever run on these GPUs. Unless a bind
            # retried since the list reused it (its Binding may land after the list).
            released += release(allocation.id)
            continue
        if (
            allocation.state == "pending"
            and bound_to == allocation.tasks[0].node
            and notes.get(ALLOCATION_ANNOTATION) == allocation.id
        ):
            allocations.confirm(state, allocation.id)
    if released:
        log.info("released %d reservations of pods that are gone or finished", len(released))
    return released


@dataclass(slots=True)
class Backstop:
    """What the reconciler's passes did: with a watch running, ``fixed`` should stay 0."""

    passes: int = 0
    fixed: int = 0


async def reconcile_forever(
    state: ServiceState,
    kube: KubeApi,
    gangs: GangCoordinator,
    interval_s: float,
    grace_s: float,
    backstop: Backstop | None = None,
) -> None:
    counts = backstop if backstop is not None else Backstop()
    while True:
        await asyncio.sleep(interval_s)
        try:
            with acting(RECONCILER):  # the audit log's actor of what it releases
                released = await off_loop(reconcile_once, state, kube, gangs, grace_s)
            counts.passes += 1
            counts.fixed += len(released)
            if released and backstop is not None:
                log.warning(
                    "the reconciler released %d reservations the pod watch had not: %s",
                    len(released),
                    ", ".join(released),
                )
        except Exception:  # the loop must outlive an API server or database hiccup
            log.exception("reconcile failed; retrying in %.0f s", interval_s)
