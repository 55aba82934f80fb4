"""A node's pods as the device plugin sees them: their reservations, and what they really got.

The kubelet gives a device plugin no pod identity, so the plugin matches an
admission to the reservations this module lists for its node (pods the
extender bound there, oldest first). Afterwards the kubelet's PodResources
API says which devices each container really got; ``report`` makes the
service's allocations say the same: the kubelet runs the pod, so its choice
wins over any reservation (``observe_all`` of service/allocations/api.py, the
truth Slurm's ``observe`` takes, for all of a report's pods at once). Every
difference is counted and kept for ``topoplace k8s reconcile``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from placement.request import MAX_TASKS
from placement.snapshot import NodeSnapshot
from service.admin_actions import Caller
from service.allocations import api as allocations
from service.allocations.results import Allocation, NotObserved, Observation
from service.errors import BadRequest, Conflict, NotFound
from service.k8s import report_order
from service.k8s.bind import ALLOCATION_ANNOTATION, GPUS_ANNOTATION
from service.k8s.device_schemas import (
    DeviceReport,
    Mismatch,
    MismatchCounts,
    Mismatches,
    PodDevices,
    PodOutcome,
    PodReservation,
)
from service.k8s.gang import TASK_ANNOTATION, task_number
from service.k8s.kube_api import KubeApi, KubeApiError, KubeConfigError
from service.k8s.pod_request import GANG, gang_of
from service.k8s.reconcile import GANG_OWNER, POD_OWNER
from service.k8s.wire import Pod
from service.log_gate import LogGate
from service.nodes import region_scope
from service.state import ServiceState

log = logging.getLogger("topoplace.k8s")
# Pods the Kubernetes API could not read, logged a while apart (_pod_here).
_unreadable_logged = LogGate()
WHOLE_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
_LIVE = ("pending", "active", "degraded")
_FINISHED = ("Succeeded", "Failed")
_RECENT = 200
# The same difference is reported every 10 s per node while the pod runs: its line is
# logged when it first appears (or changes), then at most once per this, with the count
# held back in between.
MISMATCH_LOG_EVERY_S = 600.0
# Unmoved differences remembered so a repeat is counted once; one forgotten (the oldest
# first) is counted and kept once more, which costs one entry.
_UNMOVED_KEPT = 10_000
# Reads of one report, each on the snapshot the one before found replaced.
_ATTEMPTS = 3
# A gang's allocation: each task a member pod of its own. A pod the kubelet gave GPUs of
# a task whose member is not on them takes those alone, not the gang's other tasks.
_BY_TASK = (GANG_OWNER,)


def resource_of(allocation: Allocation, snapshot: NodeSnapshot) -> str:
    """The kubelet resource a pod reservation's devices are advertised as."""
    migs = [t for t in allocation.tasks if t.mig_uuids]
    if not migs:
        return WHOLE_GPU
    profiles = {m.uuid: m.profile for m in snapshot.mig_instances}
    return MIG_PREFIX + profiles.get(migs[0].mig_uuids[0], "unknown")


def _pod_name(owner: str | None) -> tuple[str, str] | None:
    if not owner or not owner.startswith(POD_OWNER):
        return None
    namespace, _, name = owner[len(POD_OWNER) :].partition("/")
    return (namespace, name) if namespace and name else None


def _snapshot(state: ServiceState, node: str) -> NodeSnapshot:
    with state.lock:
        if node not in state.cluster:
            raise NotFound(f"node {node!r} is unknown to topoplace (has its agent reported?)")
        return state.cluster.node(node).snapshot


def pod_allocations(state: ServiceState, node: str) -> list[Allocation]:
    """Live allocations the extender made for single pods on ``node``, oldest first."""
    found: dict[str, Allocation] = {}
    for status in _LIVE:
        for allocation in allocations.listing(state, None, node, status, 10_000):
            if _pod_name(allocation.owner) and any(t.node == node for t in allocation.tasks):
                found[allocation.id] = allocation
    return sorted(found.values(), key=lambda a: (a.created_at, a.id))


def _devices_on(allocation: Allocation, node: str) -> list[str]:
    return [d for t in allocation.tasks if t.node == node for d in t.devices]


def reservations(state: ServiceState, node: str) -> list[PodReservation]:
    snapshot = _snapshot(state, node)
    out = []
    for allocation in pod_allocations(state, node):
        named = _pod_name(allocation.owner)
        assert named is not None and allocation.state in _LIVE
        tasks = [t for t in allocation.tasks if t.node == node]
        out.append(
            PodReservation(
                allocation_id=allocation.id,
                state=allocation.state,
                namespace=named[0],
                pod=named[1],
                pod_uid=allocation.job_id,
                resource=resource_of(allocation, snapshot),
                devices=_devices_on(allocation, node),
                gpu_indices=[i for t in tasks for i in t.gpu_indices],
                numa_nodes=sorted({n for t in tasks for n in t.numa_nodes}),
                nvlink_connected=all(t.nvlink_connected for t in tasks),
                created_at=allocation.created_at,
            )
        )
    return out


MismatchKey = tuple[str, str, str, str, tuple[str, ...]]


def mismatch_key(mismatch: Mismatch) -> MismatchKey:
    """What makes a difference the same one when it is reported again."""
    return (
        mismatch.node,
        mismatch.namespace,
        mismatch.pod,
        mismatch.action,
        tuple(mismatch.allocated),
    )


class MismatchLog:
    """How often the kubelet's truth differed from the service's view, since start."""

    def __init__(
        self,
        log_every_s: float = MISMATCH_LOG_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self.counts = MismatchCounts()
        self.recent: deque[Mismatch] = deque(maxlen=_RECENT)
        # Each node's own, for its agent's answer: the totals are the whole cluster's,
        # which a node's agent token may not read (GET /v1/k8s/mismatches is a reader's).
        self._by_node: dict[str, MismatchCounts] = {}
        # A difference that is not moved (MIG, gangs) is reported every round: count and
        # keep it once, so its repeats do not push the others out of ``recent``. A dict for
        # its order: the oldest is forgotten first.
        self._unmoved: dict[MismatchKey, None] = {}
        # Its warning: once when it appears, then once a while (``_record``).
        self.logged = LogGate(every_s=log_every_s, clock=clock)

    def add(self, mismatch: Mismatch) -> None:
        key = mismatch_key(mismatch)
        with self._lock:
            if mismatch.action == "unmatched":
                if key in self._unmoved:
                    return
                if len(self._unmoved) >= _UNMOVED_KEPT:
                    del self._unmoved[next(iter(self._unmoved))]
                self._unmoved[key] = None
            self.recent.append(mismatch)
            node = self._by_node.setdefault(mismatch.node, MismatchCounts())
            for counts in (self.counts, node):
                if mismatch.action in ("moved", "created", "unmatched"):
                    name = mismatch.action
                    setattr(counts, name, getattr(counts, name) + 1)
                counts.superseded += len(mismatch.superseded)

    def view(self) -> Mismatches:
        with self._lock:
            return Mismatches(counts=self.counts.model_copy(), recent=list(self.recent))

    def counts_of(self, node: str) -> MismatchCounts:
        """The counts of ``node``'s differences alone."""
        with self._lock:
            return self._by_node.get(node, MismatchCounts()).model_copy()


def _check_devices(snapshot: NodeSnapshot, report: DeviceReport) -> dict[str, int]:
    """GPU UUID -> index; every reported device must be one of the node's, named once per
    pod, and every pod reported once (a 400 otherwise, before anything changes)."""
    by_uuid = {g.uuid: g.index for g in snapshot.gpus}
    migs = {m.uuid for m in snapshot.mig_instances}
    seen: set[tuple[str, str]] = set()
    for i, pod in enumerate(report.pods):
        if (pod.namespace, pod.name) in seen:
            # One pod's truth twice: the second would move what the first just moved.
            raise BadRequest(
                f"pod {pod.namespace}/{pod.name} is reported twice", {"field": f"pods.{i}"}
            )
        seen.add((pod.namespace, pod.name))
        for j, device in enumerate(pod.devices):
            where = {"field": f"pods.{i}.devices", "device": device}
            if device not in by_uuid and device not in migs:
                raise BadRequest(
                    f"pod {pod.namespace}/{pod.name}: device {device!r} is not a GPU or MIG"
                    f" instance of node {snapshot.name} as its agent reported it",
                    where,
                )
            if device in pod.devices[:j]:
                raise BadRequest(
                    f"pod {pod.namespace}/{pod.name}: device {device!r} is named twice", where
                )
    return by_uuid


def _mig_unknown(snapshot: NodeSnapshot, report: DeviceReport) -> bool:
    """Whether the report is of a MIG resource no instance of ``snapshot`` is."""
    profiles = {MIG_PREFIX + m.profile for m in snapshot.mig_instances}
    return report.resource.startswith(MIG_PREFIX) and report.resource not in profiles


def _order_key(snapshot: NodeSnapshot, report: DeviceReport) -> str:
    """The name the report's order is kept under (a row per node and name): a MIG
    resource's own, which must be one of the node's profiles (a 400 otherwise, before
    anything changes), and ``nvidia.com/gpu`` for whole GPUs, whatever the plugin calls
    them (``--gpu-resource``). So the rows are bounded by the node's devices, not by the
    names its agent could invent."""
    if not report.resource.startswith(MIG_PREFIX):
        return WHOLE_GPU
    if _mig_unknown(snapshot, report):
        profiles = sorted({m.profile for m in snapshot.mig_instances})
        raise BadRequest(
            f"node {snapshot.name} has no MIG instance of resource {report.resource!r};"
            f" its MIG profiles are {', '.join(profiles) or 'none'}",
            {"field": "resource"},
        )
    return report.resource


def _names_unknown(snapshot: NodeSnapshot, report: DeviceReport) -> bool:
    """Whether the report names a device that is no GPU or MIG instance of ``snapshot``."""
    known = {g.uuid for g in snapshot.gpus} | {m.uuid for m in snapshot.mig_instances}
    return any(d not in known for pod in report.pods for d in pod.devices)


def _contested(kube: Callable[[], KubeApi], node: str, report: DeviceReport) -> set[str]:
    """Devices that two unfinished pods of the report both name. The kubelet lists a
    finished pod's devices after it gave them to the next pod (kubernetes#119423), so a
    device named twice is the next pod's; named by two pods that both run, it is neither's
    to take from the other (moving one pod onto it would release the other's allocation)."""
    counts = Counter(d for pod in report.pods for d in pod.devices)
    doubled = {d for d, n in counts.items() if n > 1}
    if not doubled:
        return set()
    claims: Counter[str] = Counter()
    for pod in report.pods:
        named = doubled.intersection(pod.devices)
        if not named:
            continue
        try:
            found = kube().get_pod(pod.namespace, pod.name)
        except (KubeApiError, KubeConfigError):
            claims.update(named)  # unread: it may run on them
            continue
        if found is not None and _not_running_here(found, node, report.listed_at) is None:
            claims.update(named)
    return {d for d, n in claims.items() if n > 1}


@dataclass
class _Pending:
    """A pod whose truth is taken with the report's others (``allocations.observe_all``):
    a single pod's (its job), or a gang member's (its task of the gang's allocation)."""

    pod: PodDevices
    outcome: PodOutcome
    reserved: list[str]
    truth: allocations.ObservedJob | allocations.ObservedTask


def check_scope(state: ServiceState, node: str, caller: Caller) -> None:
    """404 for a node topoplace does not know, 403 for a caller whose region it is not in
    (as memory has it; ``report`` checks the stored region again)."""
    snapshot = _snapshot(state, node)
    region_scope.check(caller, node, snapshot.region, snapshot.region)


def report(
    state: ServiceState,
    kube: Callable[[], KubeApi],
    node: str,
    body: DeviceReport,
    mismatches: MismatchLog,
    caller: Caller,
) -> list[PodOutcome]:
    """The report's truths, its devices named on one snapshot of the node: when the
    database holds a newer one (stored through another replica, or here meanwhile), the
    report is read again on it (allocations.NodeChanged), as that snapshot says. A
    device memory does not know has the node read from the database before the report
    is judged: it may be one of a snapshot another replica stored (a board replaced),
    which this replica has not heard of yet.

    A region-scoped agent's report is judged only on a snapshot of its region. The
    token check read the region from memory, which may not have heard of the node's
    move to another region; the snapshot the report is judged on is the one its holds
    name, which the database holds still when they commit (else NodeChanged, and the
    report is judged again on the stored one), so the region checked is the stored
    one at the write.

    Its List is taken in order (service/k8s/report_order.py): the newest List taken for
    the node and resource is read before anything else of the report, and a report
    older than it is deferred whole. The transaction that takes the report first
    advances it from what was read; when another report was taken meanwhile (on any
    replica), it takes nothing and the report is read again, after that one."""
    known = _snapshot(state, node)
    if _names_unknown(known, body) or _mig_unknown(known, body):
        state.sync_nodes([node])
    for attempt in range(_ATTEMPTS):
        snapshot = _snapshot(state, node)
        # The caller's region first: a refusal of the resource names the node's profiles.
        region_scope.check(caller, node, snapshot.region, snapshot.region)
        # Before the node's allocations and pods are read (a device report changes no
        # snapshot; one changed meanwhile is NodeChanged at the commit).
        order = report_order.read(state.engine, node, _order_key(snapshot, body), body)
        deferred = report_order.stale(order, body)
        if deferred is not None:
            return deferred
        try:
            return _report_on(state, kube, snapshot, body, mismatches, order)
        except allocations.NodeChanged:
            if attempt == _ATTEMPTS - 1:
                raise
        except report_order.OrderMoved:
            if attempt == _ATTEMPTS - 1:
                return report_order.moved_meanwhile(body)
    raise AssertionError("the last attempt returns or raises")


def _report_on(
    state: ServiceState,
    kube: Callable[[], KubeApi],
    snapshot: NodeSnapshot,
    body: DeviceReport,
    mismatches: MismatchLog,
    order: report_order.Order,
) -> list[PodOutcome]:
    node = snapshot.name
    by_uuid = _check_devices(snapshot, body)
    contested = _contested(kube, node, body)
    held = {_pod_name(a.owner): a for a in pod_allocations(state, node)}
    found = [
        _reconcile_pod(
            state, kube, snapshot, by_uuid, held, pod, mismatches, contested, body.listed_at
        )
        for pod in body.pods
    ]
    pending = [f for f in found if isinstance(f, _Pending)]
    # One transaction for every pod and gang member that moves: two the kubelet admitted
    # the other way round swap devices, and each keeps its own allocation; a report that
    # fails part way leaves nothing of it. The report's order is advanced in it, first,
    # even when nothing moves: an older report is then not taken after this one.
    truths = [p.truth for p in pending]
    answers = allocations.observe_all(state, truths, report_order.advance(order))
    for p, answer in zip(pending, answers, strict=True):
        _observed(p, answer, node, mismatches)
    return [f.outcome if isinstance(f, _Pending) else f for f in found]


def _reconcile_pod(
    state: ServiceState,
    kube: Callable[[], KubeApi],
    snapshot: NodeSnapshot,
    by_uuid: dict[str, int],
    held: dict[tuple[str, str] | None, Allocation],
    pod: PodDevices,
    mismatches: MismatchLog,
    contested: set[str],
    listed_at: datetime | None,
) -> PodOutcome | _Pending:
    node = snapshot.name
    allocation = held.get((pod.namespace, pod.name))
    reserved = _devices_on(allocation, node) if allocation is not None else []
    outcome = PodOutcome(namespace=pod.namespace, name=pod.name, action="matched")
    if allocation is not None and set(reserved) == set(pod.devices):
        outcome.allocation_id = allocation.id
        return outcome
    both = sorted(contested.intersection(pod.devices))
    if both:
        outcome.action = "unmatched"
        outcome.message = f"another running pod of the report names {', '.join(both)} too"
        outcome.allocation_id = allocation.id if allocation else None
        _record(mismatches, node, pod, outcome, reserved, ())
        return outcome
    mig = [d for d in pod.devices if d not in by_uuid]
    if mig and len(mig) != len(pod.devices):
        outcome.action = "unmatched"
        outcome.message = "whole GPUs and MIG instances in one report of a pod are not moved"
        outcome.allocation_id = allocation.id if allocation else None
        _record(mismatches, node, pod, outcome, reserved, ())
        return outcome
    found = _pod_here(kube, node, pod, outcome, listed_at)
    if found is None:
        return outcome
    meta = found.get("metadata") or {}
    job_id = str(meta.get("uid") or "")
    if allocation is not None and allocation.job_id != job_id:
        # An earlier pod of this name (deleted and made again, as a StatefulSet's are): its
        # reservation ends with that pod, and moving it would hand this pod's GPUs to it.
        allocation, reserved = None, []
    other = _other_resource(allocation, snapshot, pod)
    if other is not None:
        outcome.action = "unmatched"
        outcome.message = (
            f"the pod's allocation holds its devices of {other}: a pod given devices of"
            " two resources is reported once per resource, and one report does not move"
            " the other's devices"
        )
        outcome.allocation_id = allocation.id if allocation else None
        _record(mismatches, node, pod, outcome, reserved, ())
        return outcome
    annotations = meta.get("annotations") or {}
    if allocation is None and GANG in annotations:
        return _reconcile_member(state, snapshot, by_uuid, pod, found, mismatches, outcome)
    if not job_id:
        outcome.action = "deferred"
        outcome.message = "the pod has no UID yet"
        return outcome
    owner = f"{POD_OWNER}{pod.namespace}/{pod.name}"
    named = [allocation.id] if allocation is not None else []
    reason = f"observed: the kubelet gave pod {pod.namespace}/{pod.name} these devices"
    on = {node: snapshot}  # the snapshot the devices were checked on
    # Read while the pod ran, taken perhaps after it ended (the watch released it at its
    # end, and its GPUs went on): then nothing is written for it (``started``), or it
    # would hold a gone pod's GPUs and release what holds them now as stale. ``confined``:
    # a node's report ends no allocation that holds another node's devices too.
    if mig:
        job = allocations.mig_truth(
            state,
            job_id,
            owner,
            node,
            mig,
            named,
            reason,
            on,
            started=True,
            by_task=_BY_TASK,
            confined=True,
        )
    else:
        indices = sorted(by_uuid[d] for d in pod.devices)
        job = allocations.gpus_truth(
            state,
            job_id,
            owner,
            {node: indices},
            named,
            reason,
            started=True,
            on=on,
            by_task=_BY_TASK,
            confined=True,
        )
    return _Pending(pod, outcome, reserved, job)


def _other_resource(
    allocation: Allocation | None, snapshot: NodeSnapshot, pod: PodDevices
) -> str | None:
    """The resource the pod's allocation holds when the reported devices are of another:
    the plugin reports each resource apart, so the pod holds both (a pod another
    scheduler bound may ask two MIG profiles, or a GPU and an instance). Its truth is
    taken over all of a pod's allocations, so moving them onto this report's devices
    would give up the other resource's, and that resource's report would move them
    back, each round. None when they are of one resource, or either is unknown."""
    if allocation is None:
        return None
    held = resource_of(allocation, snapshot)
    reported = _resource_of_devices(snapshot, pod.devices)
    if reported is None or held.endswith("unknown") or held == reported:
        return None
    return held


def _resource_of_devices(snapshot: NodeSnapshot, devices: list[str]) -> str | None:
    """The kubelet resource ``devices`` are advertised as; None when not one."""
    profiles = {m.uuid: m.profile for m in snapshot.mig_instances}
    kinds = {MIG_PREFIX + profiles[d] if d in profiles else WHOLE_GPU for d in devices}
    return next(iter(kinds)) if len(kinds) == 1 else None


def _observed(
    p: _Pending, answer: Observation | NotObserved, node: str, mismatches: MismatchLog
) -> None:
    outcome = p.outcome
    if isinstance(answer, NotObserved):
        # Another task of the gang holds those GPUs, or the gang ended: said, not guessed.
        outcome.action = "unmatched"
        outcome.message = answer.message
        _record(mismatches, node, p.pod, outcome, p.reserved, ())
        return
    observation = answer
    if observation.action == "ended":  # its end was said after the report read it
        outcome.action = "deferred"
        outcome.message = "the pod ended while its report was taken: nothing is held for it"
        return
    outcome.action = "moved" if observation.action == "moved" else "matched"
    if observation.action == "created":
        outcome.action = "created"
    outcome.allocation_id = observation.allocation_id
    if outcome.action != "matched" or observation.superseded:
        _record(mismatches, node, p.pod, outcome, p.reserved, observation.superseded)


def _pod_here(
    kube: Callable[[], KubeApi],
    node: str,
    pod: PodDevices,
    outcome: PodOutcome,
    listed_at: datetime | None,
) -> Pod | None:
    """The pod that has this name now, read from the Kubernetes API, if it is bound to
    ``node`` and its devices in the report are its own; else None, and ``outcome``
    deferred with why. The kubelet names pods, not their UIDs: a pod of that name bound
    to another node, or to none, or one this node's kubelet had not started when the
    report's List was read, is not the one the List shows (the report is of an earlier
    pod of that name)."""
    try:
        found = kube().get_pod(pod.namespace, pod.name)
    except (KubeApiError, KubeConfigError) as exc:
        # The API's words stay in the service's log: they may name the API server, the
        # service's account and what it may not read, none of the node's own facts. Met
        # for every such pod of every node's report (each 10 s) while it lasts, so one
        # line per kind of failure a while, with the count held back since: the API's
        # words name the pod, and keyed on them a pod's line would repeat every report.
        held = _unreadable_logged.due((type(exc).__name__, getattr(exc, "status", None)))
        if held is not None:
            log.warning(
                "device report of %s: cannot read pod %s/%s: %s (%d such reads failed"
                " unlogged since the last line)",
                node,
                pod.namespace,
                pod.name,
                exc,
                held,
            )
        outcome.action = "deferred"
        outcome.message = "cannot read the pod from the Kubernetes API now (the service logs why)"
        return None
    if found is None:
        outcome.action = "deferred"
        outcome.message = _not_here(node)
        return None
    why = _not_running_here(found, node, listed_at)
    if why is not None:
        outcome.action = "deferred"
        outcome.message = why
        return None
    return found


def _not_here(node: str) -> str:
    """Why a pod the API does not show bound to ``node`` is not taken: one answer whether it
    is gone, not bound, or bound to another node. Which of them is not this node's to
    learn: the pod is read with the service's account, and a node's agent token would
    learn which pod names exist in every namespace, and which are bound (a node's
    kubelet may read the pods bound to it only)."""
    return (
        f"no pod of this name is bound to {node} in the Kubernetes API: the report is of an"
        " earlier pod of that name (gone, or made again elsewhere)"
    )


def _not_running_here(found: Pod, node: str, listed_at: datetime | None) -> str | None:
    """Why the pod read from the API is not one this node's kubelet runs devices for,
    or not the one the report's List showed under its name; None when it is."""
    if (found.get("spec") or {}).get("nodeName") != node:
        return _not_here(node)
    phase = (found.get("status") or {}).get("phase")
    if phase in _FINISHED:
        return (
            f"the pod has {phase}: it runs on nothing (the kubelet lists a finished pod's"
            " devices after it gave them to another pod)"
        )
    return _listed_before_start(found, listed_at)


def _listed_before_start(found: Pod, listed_at: datetime | None) -> str | None:
    """Why the List may predate this pod: the kubelet gives a pod its devices when it
    admits it, and writes ``status.startTime`` then. With no start yet, the devices its
    List shows under the pod's name are an earlier pod's of that name (deleted, its
    successor bound here since). ``listed_at``, when the plugin read the List by the
    node's clock (the kubelet's too): one read before the start, or within its second
    (the API keeps whole seconds), may have been answered before it."""
    uid = (found.get("metadata") or {}).get("uid")
    started = _started_at(found)
    if started is None:
        return (
            f"the kubelet has not started the pod of this name (UID {uid}) yet: the devices"
            " listed under its name are an earlier pod's"
        )
    if listed_at is not None and listed_at < started + timedelta(seconds=1):
        return (
            f"the kubelet's List was read at {listed_at.isoformat()}, before it started the"
            f" pod of this name (UID {uid}) at {started.isoformat()}: the devices listed"
            " under its name are an earlier pod's"
        )
    return None


def _started_at(found: Pod) -> datetime | None:
    """``status.startTime`` to the whole second; None when absent or unreadable."""
    text = (found.get("status") or {}).get("startTime")
    if not isinstance(text, str):
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).replace(microsecond=0)


def _reconcile_member(
    state: ServiceState,
    snapshot: NodeSnapshot,
    by_uuid: dict[str, int],
    pod: PodDevices,
    found: Pod,
    mismatches: MismatchLog,
    outcome: PodOutcome,
) -> PodOutcome | _Pending:
    """A gang member: its GPUs are one task of the gang's allocation (the bind annotated
    which). When the kubelet gave it others, that task alone moves onto them, with the
    report's other moves. The annotations are the pod owner's to write, so the task
    moves only when the allocation they name is the pod's own gang's (its namespace and
    gang name): a pod of another namespace naming it moves nothing."""
    node = snapshot.name
    annotations = (found.get("metadata") or {}).get("annotations") or {}
    gang = gang_of(found)
    allocation_id = str(annotations.get(ALLOCATION_ANNOTATION, ""))
    was = [g for g in str(annotations.get(GPUS_ANNOTATION, "")).split(",") if g]
    task = task_number(annotations.get(TASK_ANNOTATION, ""), MAX_TASKS)
    outcome.allocation_id = allocation_id or None
    if not allocation_id or task is None:
        outcome.action = "deferred"
        outcome.message = (
            f"the gang member is not bound by topoplace yet (no {TASK_ANNOTATION} annotation)"
        )
        return outcome
    if gang is None:  # never bound as a member: its gang annotations do not read
        outcome.action = "unmatched"
        outcome.message = "the pod's gang annotations name no gang of two or more"
        _record(mismatches, node, pod, outcome, was, ())
        return outcome
    if set(was) == set(pod.devices):
        _runs_on(state, allocation_id, gang.key)
        return outcome
    if any(d not in by_uuid for d in pod.devices):
        outcome.action = "unmatched"
        outcome.message = "a gang member's MIG instances other than reserved are not moved"
        _record(mismatches, node, pod, outcome, was, ())
        return outcome
    truth = allocations.task_truth(
        state,
        allocation_id,
        task,
        node,
        sorted(by_uuid[d] for d in pod.devices),
        f"observed: the kubelet gave gang member {pod.namespace}/{pod.name} these GPUs",
        {node: snapshot},
        job_id=gang.key,
        by_task=_BY_TASK,
        confined=True,
    )
    return _Pending(pod, outcome, was, truth)


def _runs_on(state: ServiceState, allocation_id: str, job_id: str) -> None:
    """A member runs on the GPUs its task was given: the gang's allocation it names, when
    live and still waiting for a member with its TTL (its first member's confirm failed),
    is confirmed, or the sweep would end it under the running member (a member moved
    onto other GPUs takes the TTL away with its move). One whose TTL passed, or that
    ended meanwhile, is left as it is."""
    found = allocations.by_ids(state, [allocation_id])
    if not found or found[0].job_id != job_id or found[0].state != "pending":
        return
    try:
        allocations.confirm(state, allocation_id)
    except (Conflict, NotFound) as exc:
        log.info("gang allocation %s not confirmed by its member's report: %s", allocation_id, exc)


def _record(
    mismatches: MismatchLog,
    node: str,
    pod: PodDevices,
    outcome: PodOutcome,
    reserved: list[str],
    superseded: tuple[str, ...],
) -> None:
    mismatch = Mismatch(
        at=datetime.now().astimezone(),
        node=node,
        namespace=pod.namespace,
        pod=pod.name,
        action=outcome.action,
        allocation_id=outcome.allocation_id,
        reserved=reserved,
        allocated=list(pod.devices),
        superseded=list(superseded),
    )
    mismatches.add(mismatch)
    held = mismatches.logged.due(mismatch_key(mismatch))
    if held is None:
        return
    log.warning(
        "pod %s/%s on %s got %s, reserved %s: %s%s",
        pod.namespace,
        pod.name,
        node,
        ",".join(pod.devices),
        ",".join(reserved) or "nothing",
        outcome.action,
        f" (reported {held} more times since it was last logged)" if held else "",
    )
