"""Gangs: no member binds until the whole gang has a placement, reserved as one.

Members name their gang with ``topoplace.io/gang`` and its size with
``topoplace.io/gang-size``. The first member to reach bind reserves every
task of the gang at once (one allocation, job id ``k8s-gang:NS/NAME``,
all or nothing); until then filter lets a member through only to the nodes
of the gang's current plan, and if the whole gang does not fit nowhere.
Each member that binds claims one task of that allocation on its node and
carries the task's GPUs in its Binding annotations. The claims live in this
process and are rebuilt from the members' own annotations
(``topoplace.io/allocation``, ``topoplace.io/gang-task``) after a restart.
kube-scheduler talks to one replica at a time (the Service uses ClientIP
affinity), which is what keeps claims consistent.

The gang is judged against one plan from its first member's filter on.
kube-scheduler filters the next member while the previous one's bind is
still in flight, and by then its candidates lack the nodes it assumed for
the earlier members: planning the gang afresh over them would give another
placement than the one the first bind reserves, and members would be
refused at bind. So the first filter's placement is kept (``plan``, one
node per task) and every member is assigned a task of it, once, and
filtered onto exactly that task's node; the first bind reserves that plan
(candidates: the plan's nodes), and later members claim the tasks on the
nodes they were assigned. A plan nobody reserved is made again after
``PLAN_HOLD_S`` in which no member passed filter on it.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from placement import PlacementRequest
from service import schema
from service.allocations import api as allocations
from service.allocations.results import Allocation, Task
from service.allocations.schemas import PlaceRequest
from service.errors import Conflict, NotFound, ServiceError
from service.flows import Flow
from service.k8s.kube_api import KubeApi, KubeApiError, KubeConfigError
from service.k8s.pod_request import Gang, PodRequest, gang_of
from service.k8s.screening import PREFIX, Judgement, no_one
from service.k8s.wire import MAX_PRIORITY
from service.state import ServiceState

log = logging.getLogger("topoplace.k8s")

LIVE = schema.LIVE_STATES
ALLOCATION_ANNOTATION = "topoplace.io/allocation"
TASK_ANNOTATION = "topoplace.io/gang-task"


PLAN_HOLD_S = 30.0


class BindRefused(Exception):
    """This bind cannot happen now; the message is the ExtenderBindingResult.Error."""


class GangUnread(Exception):
    """The gang's members could not be listed from the Kubernetes API, so which of its
    tasks they hold is unknown. Nothing of the gang is remembered: the next member's
    filter or bind reads it again. The message says so, for a filter's refusal (which
    kube-scheduler retries) or a bind's error (after PREFIX)."""

    def __init__(self, gang: Gang, reason: str) -> None:
        super().__init__(
            f"gang {gang.name}'s members could not be read from the Kubernetes API"
            f" ({reason}); read again at its next member's filter or bind"
        )


@dataclass(slots=True)
class GangState:
    allocation: Allocation | None = None  # the live reservation
    claims: dict[int, str] = field(default_factory=dict)  # task index -> pod uid
    plan: list[str] | None = None  # node per task, from the first member's filter
    used_at: float = 0.0  # when a member was last judged against the plan
    assigned: dict[str, str] = field(default_factory=dict)  # pod uid -> node of its task

    def task_of(self, uid: str) -> int | None:
        return next((t for t, owner in self.claims.items() if owner == uid), None)

    def open_tasks(self) -> list[Task]:
        if self.allocation is None:
            return []
        return [t for t in self.allocation.tasks if t.task not in self.claims]


class GangCoordinator:
    def __init__(self, state: ServiceState, kube: Callable[[], KubeApi]) -> None:
        self.state = state
        self.kube = kube
        self._lock = threading.Lock()
        self._gang_locks: dict[str, threading.Lock] = {}
        self._gangs: dict[str, GangState] = {}

    def lock(self, gang: Gang) -> threading.Lock:
        with self._lock:
            return self._gang_locks.setdefault(gang.key, threading.Lock())

    def forget(self, key: str) -> None:
        with self._lock:
            self._gangs.pop(key, None)
            self._gang_locks.pop(key, None)

    def member_gone(self, key: str, uid: str) -> None:
        """A member's pod ended: its task (claimed or assigned) is free for a recreated one."""
        with self._lock:
            known = self._gangs.get(key)
            if known is None:
                return
            known.assigned.pop(uid, None)
            for task in [t for t, owner in known.claims.items() if owner == uid]:
                del known.claims[task]

    def release_if_ended(self, gang: Gang, gone: str) -> tuple[str, ...]:
        """Release the gang's reservation if no member but ``gone`` (a pod's UID) is left;
        the ids released.

        The caller's view of the members (the pod watch's) may be behind the API server:
        a member made after the last one it knew of was deleted may already have bound
        onto the reservation and run on its GPUs. So the namespace's pods are read afresh
        and the decision is taken under the gang's lock, which every bind of a member in
        this process holds while it claims a task. A member's bind on another replica
        holds no lock here: a member made after the list and bound there stamped the
        reservation when it claimed its task, so the release ends only what was neither
        made nor stamped after the list was asked for. Blocking; raises KubeApiError or
        KubeConfigError when the pods cannot be read (the reconciler then decides).
        """
        with self.lock(gang):
            listed_at = self.state.clock()  # the list is no newer than this
            pods = self.kube().list_pods(gang.namespace)
            for pod in pods:
                member = gang_of(pod)
                uid = str((pod.get("metadata") or {}).get("uid") or "")
                if member is not None and member.key == gang.key and uid != gone:
                    log.info("gang %s: member %s is still there; kept", gang.key, uid)
                    return ()
            ended = allocations.release_job(self.state, gang.key, quiet=listed_at)
            self.forget(gang.key)  # kept or not, read afresh on the next member's sight
            return ended.ids

    def seen(self, gang: Gang) -> Flow[GangState]:
        """The gang as this process knows it. On first sight it is read from the database
        and the pods: a step the flow's driver runs off the event loop
        (service/event_loop.py)."""
        with self._lock:
            known = self._gangs.get(gang.key)
        if known is None:
            known = yield functools.partial(self.current, gang)
        return known

    def current(self, gang: Gang) -> GangState:
        """The gang as this process knows it; read from the database and the pods on first
        sight (blocking: called off the event loop). GangUnread: the pods could not be
        read, and nothing is remembered."""
        with self._lock:
            known = self._gangs.get(gang.key)
        if known is not None:
            return known
        found = GangState(allocation=self._live_allocation(gang))
        if found.allocation is not None:
            found.claims = self._claims_from_pods(gang, found.allocation)
        with self._lock:
            return self._gangs.setdefault(gang.key, found)

    def update(self, gang: Gang, allocation: Allocation) -> None:
        """The gang's reservation as it is now (after a confirm), called with :meth:`lock` held."""
        known = self.current(gang)
        if known.allocation is not None and known.allocation.id == allocation.id:
            known.allocation = allocation

    def _live_allocation(self, gang: Gang) -> Allocation | None:
        rows = allocations.listing(self.state, gang.key, None, None, 100)
        live = [a for a in rows if a.state in LIVE]
        return live[0] if live else None

    def _claims_from_pods(self, gang: Gang, allocation: Allocation) -> dict[int, str]:
        """Which member holds which task, from the members' annotations. An API that does
        not answer is not a gang with no member holding a task: remembered so, every task
        looked free until the process restarted, and a new member was filtered and bound
        onto a task (GPUs) a running member holds."""
        try:
            pods = self.kube().list_pods(gang.namespace)
        except (KubeApiError, KubeConfigError) as exc:
            log.warning("gang %s: cannot read its pods to rebuild claims: %s", gang.key, exc)
            raise GangUnread(gang, str(exc)) from exc
        claims: dict[int, str] = {}
        for pod in pods:
            task = _claimed_task(pod, allocation)
            if task is not None:
                claims[task] = str(pod["metadata"].get("uid", ""))
        return claims

    # -- filter and prioritize --------------------------------------------------

    def judge(self, pod: PodRequest, names: list[str], known: GangState) -> Judgement:
        """A member's judgement, from the gang as :meth:`seen` gave it: in memory only."""
        assert pod.gang is not None and pod.request is not None
        gang = pod.gang
        mine = known.task_of(pod.uid)
        if mine is not None and known.allocation is not None:
            node = known.allocation.tasks[mine].node
            return _only(
                names, Counter({node: 1}), f"this member of gang {gang.name} holds GPUs on {node}"
            )
        with self._lock:
            if known.allocation is not None:
                room = Counter(t.node for t in known.open_tasks())
                return self._assign(known, gang.name, pod.uid, names, room, "reserved GPUs")
            now = time.monotonic()
            plan = known.plan
            if plan is not None and now - known.used_at <= PLAN_HOLD_S:
                judged = self._assign(known, gang.name, pod.uid, names, Counter(plan), "placement")
                if judged.passing:  # a plan whose nodes kube no longer offers ages out
                    known.used_at = now
                return judged
        request = pod.gang_request().model_copy(update={"nodes": tuple(names)})
        with self.state.lock:
            self.state.refresh_if_due()
            outcome = self.state.cluster.place(request)
        if outcome.placement is None:
            message = f"gang {gang.name} ({gang.size} pods) does not fit: {outcome.summary()}"
            return no_one(names, message, outcome.status == "unschedulable")
        with self._lock:
            if known.allocation is None and (known.plan is None or known.plan is plan):
                known.plan = [t.node for t in outcome.placement.tasks]
                known.assigned = {}
            known.used_at = time.monotonic()
            if known.allocation is not None:
                room = Counter(t.node for t in known.open_tasks())
                return self._assign(known, gang.name, pod.uid, names, room, "reserved GPUs")
            assert known.plan is not None
            return self._assign(known, gang.name, pod.uid, names, Counter(known.plan), "placement")

    def _assign(
        self,
        known: GangState,
        gang_name: str,
        uid: str,
        names: list[str],
        room: Counter[str],
        what: str,
    ) -> Judgement:
        """This member's task: the one it was given, else a free one among the candidates;
        it passes only on that task's node. Called with the coordinator's lock held."""
        node = known.assigned.get(uid)
        if node is None or room[node] == 0:
            taken = Counter(n for other, n in known.assigned.items() if other != uid)
            free = [n for n in names if room[n] - taken[n] > 0]
            if not free:
                known.assigned.pop(uid, None)
                return _only(
                    names, Counter(), f"gang {gang_name}'s {what} has no task left on these nodes"
                )
            node = free[0]
            known.assigned[uid] = node
        return _only(
            names, Counter({node: 1}), f"gang {gang_name}'s {what} puts this member on {node}"
        )

    # -- bind ----------------------------------------------------------------------

    def claim(self, pod: PodRequest, node: str, ttl_s: float) -> tuple[Allocation, int]:
        """Reserve the gang if nobody has, then give this member a task on ``node``.

        Called with :meth:`lock` held. Returns (allocation, task index).

        A reservation reused is stamped first (``allocations.touch``), before the member's
        Binding: a release decided from a pod list read before this member existed or
        bound (the reconciler's, another replica's watch) then leaves it. One not yet
        confirmed gets its TTL again from now (``ttl_s``), so it cannot expire under the
        Binding this member writes next (the gang's first Binding was refused, and the
        member came as its TTL ran out). One found ended, or whose TTL passed, is
        forgotten, and the gang reserved anew.
        """
        assert pod.gang is not None and pod.request is not None
        gang = pod.gang
        known = self.current(gang)
        if known.allocation is not None:
            touched = allocations.touch(self.state, known.allocation.id)
            if touched is not None and touched.expires_at is not None:  # not confirmed yet
                touched = self._extended(touched, ttl_s)
            if touched is None:
                known.allocation, known.claims = None, {}
            else:
                known.allocation = touched
        mine = known.task_of(pod.uid)
        if mine is not None and known.allocation is not None:
            held = known.allocation.tasks[mine].node
            if held != node:
                # The member may run there already (an earlier bind's answer lost): its
                # Binding elsewhere would carry that node's GPUs, and its refusal (the
                # pod is bound) would drop the claim of a task the pod runs on.
                raise BindRefused(
                    f"{PREFIX}this member of gang {gang.name} holds its task on {held},"
                    f" not on {node}"
                )
            return known.allocation, mine
        if known.allocation is None:
            with self._lock:
                plan = known.plan
            try:
                reserved = self._reserve(pod, gang, ttl_s, plan)
            except BindRefused:
                with self._lock:
                    known.plan, known.assigned = None, {}  # the next filter plans again
                raise
            with self._lock:
                known.allocation, known.claims = reserved, {}
        with self._lock:
            for task in known.open_tasks():
                if task.node != node:
                    continue
                known.claims[task.task] = pod.uid
                known.assigned.pop(pod.uid, None)
                return known.allocation, task.task
        nodes = sorted({t.node for t in known.open_tasks()})
        raise BindRefused(
            f"{PREFIX}gang {gang.name}'s reservation has no free task on {node}"
            f" (free tasks on: {', '.join(nodes) or 'none'})"
        )

    def _extended(self, allocation: Allocation, ttl_s: float) -> Allocation | None:
        """The pending reservation with ``ttl_s`` from now; None when its TTL has passed
        (the extend expires it) or it ended meanwhile. One confirmed since the stamp (the
        reconciler saw a bound member carry it, another replica's member bound) has no
        TTL left to give and is kept as it is now: taken for ended, the gang forgot the
        reservation its members run on and could never be reserved again over its GPUs.
        Any other failure (the database unreachable) is raised: it says nothing of
        whether the reservation lives."""
        try:
            return allocations.extend(self.state, allocation.id, ttl_s)
        except (Conflict, NotFound):
            pass
        now = allocations.by_ids(self.state, [allocation.id])
        return now[0] if now and now[0].state in LIVE else None

    def unclaim(self, pod: PodRequest, task: int) -> None:
        assert pod.gang is not None
        known = self.current(pod.gang)
        if known.claims.get(task) == pod.uid:
            del known.claims[task]

    def _reserve(
        self, pod: PodRequest, gang: Gang, ttl_s: float, plan: list[str] | None
    ) -> Allocation:
        request: PlacementRequest = pod.gang_request()
        if plan is not None:  # the placement every member was filtered against
            request = request.model_copy(update={"nodes": tuple(dict.fromkeys(plan))})
        body = PlaceRequest.model_validate(
            {
                **request.model_dump(),
                "job_id": gang.key,
                "owner": f"k8s-gang:{gang.namespace}/{gang.name}",
                "ttl_s": ttl_s,
            }
        )
        # The next key: counted, not listed (a listing is capped, and a key counted short
        # replays an ended reservation, whose GPUs the members' Bindings would name unheld).
        key = f"{gang.key}:{pod.uid}:{allocations.count_for_job(self.state, gang.key)}"
        try:
            placed = allocations.place(self.state, body, key)
        except ServiceError as exc:
            raise BindRefused(
                f"{PREFIX}gang {gang.name} cannot be reserved: {exc.message}"
            ) from None
        if not placed.created and placed.allocation.state not in LIVE:
            raise BindRefused(f"{PREFIX}gang {gang.name}'s reservation under {key} has ended")
        return placed.allocation


def _claimed_task(pod: dict[str, Any], allocation: Allocation) -> int | None:
    """The task of ``allocation`` that ``pod`` holds: its bind wrote the allocation and task
    into its annotations and put it on that task's node. Annotations alone are not enough:
    whoever may create pods in the namespace may copy them, and a copy would take a
    member's task (or, numbered past the gang, fault every read of it)."""
    meta, spec = pod.get("metadata"), pod.get("spec")
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return None
    notes = meta.get("annotations")
    if not isinstance(notes, dict) or notes.get(ALLOCATION_ANNOTATION) != allocation.id:
        return None
    index = task_number(notes.get(TASK_ANNOTATION, ""), len(allocation.tasks))
    if index is None or spec.get("nodeName") != allocation.tasks[index].node:
        return None
    return index


def task_number(text: object, tasks: int) -> int | None:
    """The task a gang-task annotation names among ``tasks``: plain ASCII digits below
    ``tasks``, else None. The annotation is the pod owner's to write: a superscript digit
    passes ``isdigit`` and fails ``int``, and a long one fails ``int`` too."""
    task = str(text)
    if not (task.isascii() and task.isdigit()) or len(task) > len(str(tasks)):
        return None
    index = int(task)
    return index if index < tasks else None


def _only(names: list[str], room: Counter[str], elsewhere: str) -> Judgement:
    """Pass the candidates in ``room``; refuse the others (resolvably) with ``elsewhere``."""
    passing = [n for n in names if n in room]
    refused = PREFIX + elsewhere
    failed = {n: refused for n in names if n not in room}
    top = max(room.values(), default=1)
    priorities = {n: max(1, round(MAX_PRIORITY * room[n] / top)) for n in passing}
    return Judgement(passing, failed, {}, lambda: priorities)
