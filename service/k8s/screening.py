"""One pod's verdict over the scheduler's candidate nodes: what filter and prioritize answer.

A :class:`Judgement` holds, per candidate, whether it passes (and which GPUs
it would give), why not (resolvable or not), and its 0..10 priority. Single
whole-GPU pods, the common case, are judged by the engine's array screen in
one pass over the candidates; MIG pods by ``evaluate`` (one instance) or a
placement restricted to each node (several instances, all on that node).
Everything here reads the in-memory cluster under the state lock and does no
I/O, so filter answers from memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from placement import ClusterState, PlacementRequest
from placement.explain import cause_message
from placement.screen import NodeScreen
from service.k8s.priority_json import SlotRecords
from service.k8s.wire import MAX_PRIORITY, host_priorities

PREFIX = "topoplace: "  # `kubectl describe pod` shows which filter said no
NOT_REPORTED = PREFIX + "no topoplace agent has reported this node"


@dataclass(slots=True)
class Judgement:
    passing: list[str]
    failed: dict[str, str]  # may clear by itself: FailedNodes (preemption may help)
    unresolvable: dict[str, str]  # never, as the cluster is built: FailedAndUnresolvableNodes
    # Priority per node (0..10), computed only when prioritize asks for it.
    priorities: Callable[[], dict[str, int]] = field(default=lambda: {})
    # GPU indices each passing node would give (what bind will reserve on an unchanged node).
    gpus: Callable[[str], tuple[int, ...]] = field(default=lambda _: ())
    # The HostPriorityList of ``passing`` as JSON, when the array screen can encode it
    # without a dict per node.
    encoded: Callable[[], bytes] | None = None

    def passing_priorities(self) -> bytes:
        """The HostPriorityList of ``passing``, in its order: what prioritize answers for the
        nodes filter let through, which is what kube-scheduler sends it."""
        if self.encoded is not None:
            return self.encoded()
        scores = self.priorities()
        return host_priorities(self.passing, [scores.get(n, 0) for n in self.passing])


def everyone(names: list[str]) -> Judgement:
    """The pod asks for no GPUs: topoplace has no say, every node passes."""
    return Judgement(passing=list(names), failed={}, unresolvable={})


def no_one(names: list[str], message: str, resolvable: bool) -> Judgement:
    """Every node refused for one reason (a bad annotation, a gang that cannot fit)."""
    reasons = dict.fromkeys(names, PREFIX + message)
    if resolvable:
        return Judgement(passing=[], failed=reasons, unresolvable={})
    return Judgement(passing=[], failed={}, unresolvable=reasons)


def screen_tenths(screen: NodeScreen) -> NDArray[np.int64]:
    """The engine's 0..100 score on the extender's 0..10 scale, per screened node.

    The engine's best node gets 10 and every other fitting node at most 9,
    so its choice survives the rounding to eleven levels; the scheduler
    multiplies by the extender's weight and adds its own scores. Nodes the
    ranking cannot tell from the best one (equal on every rank key) get 10
    as well: equal nodes must get equal priorities, or the scheduler's sum
    over extenders and plugins is skewed by which one came first in slot order.
    """
    tenths = np.minimum(screen.score // 10, MAX_PRIORITY - 1).astype(np.int64)
    tenths[screen.tied_best] = MAX_PRIORITY
    tenths[~screen.fits] = 0
    return tenths


def screen_priorities(screen: NodeScreen) -> dict[str, int]:
    return dict(zip(screen.names, screen_tenths(screen).tolist(), strict=True))


def judge_screen(
    cluster: ClusterState,
    request: PlacementRequest,
    names: list[str],
    records: SlotRecords | None = None,
) -> Judgement:
    """Single-task whole-GPU request over the candidates, from the array screen.
    ``records``: the cluster's HostPriority records as it is now (read under the lock), so
    prioritize can encode its answer from arrays; without them it builds dicts."""
    # Only the best node's rank matters here (it alone gets 10): no sort of every node.
    screen = cluster.screen(request.model_copy(update={"nodes": tuple(names)}), full_rank=False)
    fits = screen.fits
    where = np.flatnonzero(fits)
    # map() over C-level getters: these lists run to 10,000 names per call.
    passing = screen.names_at(where)
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if where.size < fits.size:
        codes = screen.cause_codes
        refused = np.flatnonzero(~fits)
        # One message per distinct cause: it depends only on the cause and the request.
        # Cause codes are small integers: bincount is much cheaper than np.unique here.
        for code in np.flatnonzero(np.bincount(codes[refused])).tolist():
            members = refused[codes[refused] == code]
            cause = screen.cause(int(members[0]))
            assert cause is not None
            message = PREFIX + cause_message(cause, request)
            target = failed if cause.resolvable else unresolvable
            target.update(dict.fromkeys(screen.names_at(members), message))
    for name in screen.unknown:
        failed[name] = NOT_REPORTED

    def gpus(node: str) -> tuple[int, ...]:
        # Asked once per bind at most, so a scan beats building an index per filter.
        try:
            return screen.gpu_indices(int(where[passing.index(node)]))
        except ValueError:
            return ()

    return Judgement(
        passing,
        failed,
        unresolvable,
        lambda: screen_priorities(screen),
        gpus,
        None
        if records is None
        else lambda: records.encode(screen.slots[where], screen_tenths(screen)[where]),
    )


def judge_mig(cluster: ClusterState, request: PlacementRequest, names: list[str]) -> Judgement:
    """MIG pods: one instance via ``evaluate``; several, all on one node, per node."""
    if request.tasks == 1:
        verdicts = cluster.evaluate(request.model_copy(update={"nodes": tuple(names)}))
        passing: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        priorities: dict[str, int] = {}
        chosen: dict[str, tuple[int, ...]] = {}
        for v in verdicts:
            if v.fits:
                passing.append(v.node)
                priorities[v.node] = (
                    MAX_PRIORITY if v.rank == 1 else min(MAX_PRIORITY - 1, int(v.score // 10))
                )
                chosen[v.node] = v.task.gpu_indices if v.task else ()
            else:
                target = failed if v.resolvable else unresolvable
                target[v.node] = PREFIX + v.message
        # evaluate() gives no verdict for a node it does not know: without a reason here
        # kube-scheduler drops it silently from the pod's FailedScheduling event.
        for name in names:
            if name not in cluster:
                failed[name] = NOT_REPORTED
        return Judgement(passing, failed, unresolvable, lambda: priorities, _lookup(chosen))
    return _judge_each(cluster, request, names)


def _judge_each(cluster: ClusterState, request: PlacementRequest, names: list[str]) -> Judgement:
    passing: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    priorities: dict[str, int] = {}
    chosen: dict[str, tuple[int, ...]] = {}
    for name in dict.fromkeys(names):
        if name not in cluster:
            failed[name] = NOT_REPORTED
            continue
        outcome = cluster.place(request.model_copy(update={"nodes": (name,)}))
        if outcome.placement is None:
            target = failed if outcome.status == "unschedulable" else unresolvable
            target[name] = PREFIX + outcome.reasons[0].message
            continue
        tasks = outcome.placement.tasks
        passing.append(name)
        chosen[name] = tuple(sorted({i for t in tasks for i in t.gpu_indices}))
        # What the node can still serve afterwards, on the 0..10 scale.
        kept = sum(t.score.fragmentation for t in tasks) / len(tasks)
        priorities[name] = round(MAX_PRIORITY * kept)
    return Judgement(passing, failed, unresolvable, lambda: priorities, _lookup(chosen))


def _lookup(chosen: dict[str, tuple[int, ...]]) -> Callable[[str], tuple[int, ...]]:
    return lambda node: chosen.get(node, ())
