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
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from placement import PlacementRequest
from service import schema
from service.allocations import api as allocations
from service.allocations.results import Allocation, Task
from service.allocations.schemas import PlaceRequest
from service.errors import ServiceError
from service.flows import Flow
from service.k8s.kube_api import KubeApi, KubeApiError, KubeConfigError
from service.k8s.pod_request import Gang, PodRequest
from service.k8s.screening import PREFIX, Judgement, no_one
from service.k8s.wire import MAX_PRIORITY
from service.state import ServiceState

log = logging.getLogger("topoplace.k8s")

LIVE = schema.LIVE_STATES
ALLOCATION_ANNOTATION = "topoplace.io/allocation"
TASK_ANNOTATION = "topoplace.io/gang-task"


class BindRefused(Exception):
    """This bind cannot happen now; the message is the ExtenderBindingResult.Error."""


@dataclass(slots=True)
class GangState:
    allocation: Allocation | None = None  # the live reservation
    claims: dict[int, str] = field(default_factory=dict)  # task index -> pod uid

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
        sight (blocking: called off the event loop)."""
        with self._lock:
            known = self._gangs.get(gang.key)
        if known is not None:
            return known
        found = GangState(allocation=self._live_allocation(gang))
        if found.allocation is not None:
            found.claims = self._claims_from_pods(gang, found.allocation.id)
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

    def _claims_from_pods(self, gang: Gang, allocation_id: str) -> dict[int, str]:
        try:
            pods = self.kube().list_pods(gang.namespace)
        except (KubeApiError, KubeConfigError) as exc:
            log.warning("gang %s: cannot read its pods to rebuild claims: %s", gang.key, exc)
            return {}
        claims: dict[int, str] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            notes = meta.get("annotations") or {}
            task = str(notes.get(TASK_ANNOTATION, ""))
            if notes.get(ALLOCATION_ANNOTATION) == allocation_id and task.isdigit():
                claims[int(task)] = str(meta.get("uid", ""))
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
        if known.allocation is not None:
            room = Counter(t.node for t in known.open_tasks())
            return _only(names, room, f"gang {gang.name}'s reserved GPUs are on other nodes")
        request = pod.gang_request().model_copy(update={"nodes": tuple(names)})
        with self.state.lock:
            self.state.refresh_if_due()
            outcome = self.state.cluster.place(request)
        if outcome.placement is None:
            message = f"gang {gang.name} ({gang.size} pods) does not fit: {outcome.summary()}"
            return no_one(names, message, outcome.status == "unschedulable")
        plan = Counter(t.node for t in outcome.placement.tasks)
        return _only(names, plan, f"gang {gang.name}'s placement uses other nodes")

    # -- bind ----------------------------------------------------------------------

    def claim(self, pod: PodRequest, node: str, ttl_s: float) -> tuple[Allocation, int]:
        """Reserve the gang if nobody has, then give this member a task on ``node``.

        Called with :meth:`lock` held. Returns (allocation, task index).
        """
        assert pod.gang is not None and pod.request is not None
        gang = pod.gang
        known = self.current(gang)
        if known.allocation is not None and not self._still_live(known.allocation.id):
            known.allocation, known.claims = None, {}
        mine = known.task_of(pod.uid)
        if mine is not None and known.allocation is not None:
            return known.allocation, mine
        if known.allocation is None:
            known.allocation = self._reserve(pod, gang, ttl_s)
            known.claims = {}
        for task in known.open_tasks():
            if task.node == node:
                known.claims[task.task] = pod.uid
                return known.allocation, task.task
        nodes = sorted({t.node for t in known.open_tasks()})
        raise BindRefused(
            f"{PREFIX}gang {gang.name}'s reservation has no free task on {node}"
            f" (free tasks on: {', '.join(nodes) or 'none'})"
        )

    def unclaim(self, pod: PodRequest, task: int) -> None:
        assert pod.gang is not None
        known = self.current(pod.gang)
        if known.claims.get(task) == pod.uid:
            del known.claims[task]

    def _still_live(self, allocation_id: str) -> bool:
        try:
            return allocations.get(self.state, allocation_id).state in LIVE
        except ServiceError:
            return False

    def _reserve(self, pod: PodRequest, gang: Gang, ttl_s: float) -> Allocation:
        request: PlacementRequest = pod.gang_request()
        earlier = allocations.listing(self.state, gang.key, None, None, 10_000)
        body = PlaceRequest.model_validate(
            {
                **request.model_dump(),
                "job_id": gang.key,
                "owner": f"k8s-gang:{gang.namespace}/{gang.name}",
                "ttl_s": ttl_s,
            }
        )
        try:
            key = f"{gang.key}:{pod.uid}:{len(earlier)}"
            return allocations.place(self.state, body, key).allocation
        except ServiceError as exc:
            raise BindRefused(
                f"{PREFIX}gang {gang.name} cannot be reserved: {exc.message}"
            ) from None


def _only(names: list[str], room: Counter[str], elsewhere: str) -> Judgement:
    """Pass the candidates in ``room``; refuse the others (resolvably) with ``elsewhere``."""
    passing = [n for n in names if n in room]
    refused = PREFIX + elsewhere
    failed = {n: refused for n in names if n not in room}
    top = max(room.values(), default=1)
    priorities = {n: max(1, round(MAX_PRIORITY * room[n] / top)) for n in passing}
    return Judgement(passing, failed, {}, lambda: priorities)
