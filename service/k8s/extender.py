"""The extender's four verbs, bytes in and bytes out, around the service's state.

Filter judges the pod over the candidates and keeps the judgement for a few
hundred recent pods: kube-scheduler calls prioritize with the nodes filter
let through right after, and when the cluster has not changed since (the
engine's clock did not move) prioritize answers from that judgement instead
of asking the engine again. Bind needs the pod's request, but its arguments
carry only the pod's name and UID: it is remembered from filter, or read
from the API server when another replica (or a restart) saw the filter.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from itertools import repeat
from pathlib import Path
from typing import Any

from service.errors import BadRequest
from service.event_loop import off_loop, run_here
from service.flows import Flow, drive, drive_async
from service.k8s import bind, preempt
from service.k8s.gang import GangCoordinator, GangUnread
from service.k8s.kube_api import KubeApi, KubeApiError, KubeConfigError, from_kubeconfig, in_cluster
from service.k8s.pod_request import BadPodRequest, PodRequest, parse_pod
from service.k8s.pod_watch import PodWatcher
from service.k8s.priority_json import PriorityEncoder
from service.k8s.reconcile import Backstop
from service.k8s.screening import PREFIX, Judgement, everyone, judge_mig, judge_screen, no_one
from service.k8s.settings import ExtenderSettings
from service.k8s.timed_api import TimedKubeApi
from service.k8s.wake import WakeUp
from service.k8s.wire import (
    ExtenderBindingResult,
    ExtenderPreemptionResult,
    Pod,
    binding_args,
    dumps,
    extender_args,
    field,
    filter_result,
    host_priorities,
    loads,
)
from service.state import ServiceState

RECENT_PODS = 4096  # pods remembered for bind: small objects
# Judgements kept for prioritize, which follows its filter at once. Few on purpose: one
# holds lists of every candidate, and hundreds of them (millions of references) made the
# collector's full passes stall calls by tens of milliseconds at 10,000 nodes.
JUDGEMENTS_KEPT = 4


@dataclass(slots=True)
class _Recent:
    pod: PodRequest
    version: str  # the pod's resourceVersion: annotations may change between attempts
    judgement: Judgement | None = None
    names: list[str] | None = None
    cluster_id: int = 0
    clock: int = -1


def no_api_server(exc: KubeConfigError) -> str:
    """What a bind without a Kubernetes API says: what is missing and how to give it."""
    return (
        f"cannot bind: no Kubernetes API server is configured ({exc}); the service needs"
        " one to write the pod's Binding: run it in the cluster with its service account"
        " (integrations/kubernetes/rbac.yaml) or set TOPOPLACE_K8S_KUBECONFIG"
    )


class Extender:
    def __init__(
        self, state: ServiceState, settings: ExtenderSettings, kube: KubeApi | None = None
    ) -> None:
        self.state = state
        self.settings = settings
        self._kube = kube
        self._timed: TimedKubeApi | None = None  # the same API, its calls timed for /metrics
        self._kube_lock = threading.Lock()
        self.gangs = GangCoordinator(state, self.kube)
        self._recent: OrderedDict[str, _Recent] = OrderedDict()
        self._judged: deque[_Recent] = deque()
        self._recent_lock = threading.Lock()
        self._priority_json = PriorityEncoder()
        self.watcher: PodWatcher | None = None  # set when the router's lifespan runs them
        self.wake: WakeUp | None = None
        self.backstop = Backstop()

    def health(self) -> dict[str, Any]:
        """/readyz detail: whether pods are followed (and why not), what the backstop fixed."""
        out: dict[str, Any] = (
            self.watcher.health() if self.watcher is not None else {"watch": "off"}
        )
        out["reconciled"] = {"passes": self.backstop.passes, "fixed": self.backstop.fixed}
        if self.wake is not None:
            out["wake_ups"] = self.wake.wake_ups
        return out

    def kube(self) -> KubeApi:
        """The Kubernetes API, connected on first use; KubeConfigError when unreachable."""
        with self._kube_lock:
            if self._kube is None:
                timeout = self.settings.api_timeout_s
                if self.settings.kubeconfig:
                    self._kube = from_kubeconfig(Path(self.settings.kubeconfig), timeout)
                else:
                    self._kube = in_cluster(timeout)
            if self._timed is None:
                self._timed = TimedKubeApi(self._kube, self.state.metrics.kube_api)
            return self._timed

    # -- the pod's request ---------------------------------------------------------

    def _remember(self, pod: Pod) -> _Recent:
        meta = pod.get("metadata")
        if not isinstance(meta, dict):
            meta = {}  # not cached; parse_pod refuses it, naming the field
        uid = str(meta.get("uid") or "")
        version = str(meta.get("resourceVersion") or "")
        with self._recent_lock:
            recent = self._recent.get(uid)
            if recent is not None and recent.version == version and uid:
                self._recent.move_to_end(uid)
                return recent
        recent = _Recent(pod=parse_pod(pod), version=version)
        if uid:
            with self._recent_lock:
                self._recent[uid] = recent
                while len(self._recent) > RECENT_PODS:
                    self._recent.popitem(last=False)
        return recent

    def _remembered(self, namespace: str, name: str, uid: str) -> _Recent | None:
        """The pod filter saw under ``uid``, if it is the one the bind names: a UID with
        another pod's name would otherwise bind the pod filter saw, not the one named,
        and answer that the named one was bound."""
        with self._recent_lock:
            recent = self._recent.get(uid)
        if recent is None or (recent.pod.namespace, recent.pod.name) != (namespace, name):
            return None
        return recent

    def _pod_for_bind(self, namespace: str, name: str, uid: str) -> PodRequest:
        recent = self._remembered(namespace, name, uid)
        if recent is not None:
            return recent.pod
        pod = self.kube().get_pod(namespace, name)
        if pod is None:
            raise KubeApiError(404, f"pod {namespace}/{name} does not exist")
        found = parse_pod(pod)
        if uid and found.uid != uid:
            raise KubeApiError(409, f"pod {namespace}/{name} is now another pod (UID {found.uid})")
        return found

    # -- judging ---------------------------------------------------------------------

    def _judge(self, recent: _Recent, names: list[str]) -> Flow[Judgement]:
        """The pod's judgement; a flow whose only blocking step is reading a gang this
        process has not seen yet (service/event_loop.py)."""
        pod = recent.pod
        if pod.request is None:
            return everyone(names)
        if pod.gang is not None:
            try:
                known = yield from self.gangs.seen(pod.gang)
            except GangUnread as exc:  # no node passes now; kube-scheduler filters again
                return no_one(names, str(exc), resolvable=True)
            return self.gangs.judge(pod, names, known)
        state = self.state
        with state.lock:
            state.refresh_if_due()  # as /place: walks the nodes only when one could go stale
            cluster = state.cluster
            if pod.screened:
                judgement = judge_screen(
                    cluster, pod.request, names, self._priority_json.records(cluster)
                )
            else:
                judgement = judge_mig(cluster, pod.request, names)
            cluster_id, clock = id(cluster), cluster.clock
        self._keep_judgement(recent, judgement, names, cluster_id, clock)
        return judgement

    def _keep_judgement(
        self, recent: _Recent, judgement: Judgement, names: list[str], cluster_id: int, clock: int
    ) -> None:
        with self._recent_lock:
            recent.judgement, recent.names = judgement, names
            recent.cluster_id, recent.clock = cluster_id, clock
            self._judged.append(recent)
            while len(self._judged) > JUDGEMENTS_KEPT:
                old = self._judged.popleft()
                # By identity: comparing dataclasses would compare their lists of every node.
                if not any(kept is old for kept in self._judged):
                    old.judgement, old.names = None, None

    def _cached(self, recent: _Recent, names: list[str]) -> tuple[Judgement, bool] | None:
        """The filter's judgement if nothing changed since and it covered these nodes, and
        whether ``names`` are exactly the nodes it passed."""
        with self._recent_lock:  # read together: _keep_judgement may drop them
            judgement, judged = recent.judgement, recent.names
            cluster_id, clock = recent.cluster_id, recent.clock
        if judgement is None or judged is None or recent.pod.gang is not None:
            return None
        with self.state.lock:
            cluster = self.state.cluster
            if id(cluster) != cluster_id or cluster.clock != clock:
                return None
        # kube-scheduler sends prioritize exactly the nodes filter passed: compare lists first.
        if names == judgement.passing:
            return judgement, True
        if len(names) > len(judged) or not set(judged).issuperset(names):
            return None
        return judgement, False

    # -- verbs -------------------------------------------------------------------------

    # Filter and prioritize are flows (service/flows.py): the routes drive them on the
    # event loop and hand their one blocking step, a gang's first sight, to a worker
    # thread; ``filter`` and ``prioritize`` run them where the caller is.

    def filter(self, body: bytes) -> bytes:
        return drive(self._filter(body), run_here)

    async def filter_async(self, body: bytes) -> bytes:
        return await drive_async(self._filter(body), off_loop)

    def prioritize(self, body: bytes) -> bytes:
        return drive(self._prioritize(body), run_here)

    async def prioritize_async(self, body: bytes) -> bytes:
        return await drive_async(self._prioritize(body), off_loop)

    def _filter(self, body: bytes) -> Flow[bytes]:
        pod, names, nodes = extender_args(body)
        try:
            recent = self._remember(pod)
        except BadPodRequest as exc:
            judgement = no_one(names, str(exc), resolvable=False)
        else:
            judgement = yield from self._judge(recent, names)
        return dumps(
            filter_result(judgement.passing, nodes, judgement.failed, judgement.unresolvable)
        )

    def _prioritize(self, body: bytes) -> Flow[bytes]:
        pod, names, _ = extender_args(body)
        try:
            recent = self._remember(pod)
        except BadPodRequest:
            return host_priorities(names, repeat(0, len(names)))
        cached = self._cached(recent, names)
        if cached is not None:
            judgement, exactly_passing = cached
        else:
            judgement = yield from self._judge(recent, names)
            exactly_passing = names == judgement.passing
        if exactly_passing:  # the usual call: the nodes filter let through
            return judgement.passing_priorities()
        get = judgement.priorities().get
        return host_priorities(names, map(get, names, repeat(0)))

    def bind(self, body: bytes) -> bytes:
        args = binding_args(body)
        try:
            pod = self._pod_for_bind(args["PodNamespace"], args["PodName"], args["PodUID"])
            kube = self.kube()
        except BadPodRequest as exc:
            return dumps(ExtenderBindingResult(Error=PREFIX + str(exc)))
        except KubeConfigError as exc:
            # The pod may well be known (filter saw it); what is missing is the API server
            # the Binding is written to: say so, and how to give it one.
            return dumps(ExtenderBindingResult(Error=f"{PREFIX}{no_api_server(exc)}"))
        except KubeApiError as exc:
            return dumps(ExtenderBindingResult(Error=f"{PREFIX}cannot read the pod: {exc}"))
        node = args["Node"]
        if pod.gang is not None and pod.request is not None:
            error = bind.bind_gang_member(
                self.state, kube, self.gangs, pod, node, self.settings.gang_ttl_s
            )
        else:
            error = bind.bind_pod(self.state, kube, pod, node, self.settings.bind_ttl_s)
        return dumps(ExtenderBindingResult(Error=error))

    async def bind_async(self, body: bytes) -> bytes:
        """``bind`` on the event loop for the usual pod: remembered from its filter, not a
        gang member, the API's client made. Any other (a pod read from the API server,
        a gang member under its gang's lock, the first bind, which connects) is bound
        on a worker thread by ``bind``."""
        args = binding_args(body)
        recent = self._remembered(args["PodNamespace"], args["PodName"], args["PodUID"])
        kube = self._timed
        if recent is None or kube is None or recent.pod.gang is not None:
            return await off_loop(self.bind, body)
        pod, ttl_s = recent.pod, self.settings.bind_ttl_s
        error = await bind.bind_pod_async(self.state, kube, pod, args["Node"], ttl_s)
        return dumps(ExtenderBindingResult(Error=error))

    def preempt(self, body: bytes) -> bytes:
        data = loads(body)
        pod = field(data, "Pod")
        if not isinstance(pod, dict):
            raise BadRequest("ExtenderPreemptionArgs.Pod must be a Pod object", {"field": "Pod"})
        victims = preempt.meta_victims(
            field(data, "NodeNameToVictims"), field(data, "NodeNameToMetaVictims")
        )
        try:
            request = parse_pod(pod)
        except BadPodRequest:
            return dumps(ExtenderPreemptionResult(NodeNameToMetaVictims={}))
        kept = preempt.useful(self.state, request, victims)
        return dumps(ExtenderPreemptionResult(NodeNameToMetaVictims=kept))
