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
from service.k8s.wire import MAX_PRIORITY

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
    # Priorities in the order of ``passing``, when cheaper than the dict (the array screen).
    aligned: Callable[[], list[int]] | None = None

    def passing_priorities(self) -> list[int]:
        """Priorities of ``passing``, in its order: what prioritize answers for the nodes
        filter let through, which is what kube-scheduler sends it."""
        if self.aligned is not None:
            return self.aligned()
        scores = self.priorities()
        return [scores.get(n, 0) for n in self.passing]


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
    multiplies by the extender's weight and adds its own scores.
    """
    tenths = np.minimum(screen.score // 10, MAX_PRIORITY - 1).astype(np.int64)
    tenths[screen.rank == 1] = MAX_PRIORITY
    tenths[~screen.fits] = 0
    return tenths


def screen_priorities(screen: NodeScreen) -> dict[str, int]:
    return dict(zip(screen.names, screen_tenths(screen).tolist(), strict=True))


def judge_screen(cluster: ClusterState, request: PlacementRequest, names: list[str]) -> Judgement:
    """Single-task whole-GPU request over the candidates, from the array screen."""
    screen = cluster.screen(request.model_copy(update={"nodes": tuple(names)}))
    fits = screen.fits
    screen_names = screen.names
    # map() over a C-level getter: these lists run to 10,000 names per call.
    name_at = screen_names.__getitem__
    passing = list(map(name_at, np.flatnonzero(fits).tolist()))
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    if len(passing) < len(screen_names):
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
            target.update(dict.fromkeys(map(name_at, members.tolist()), message))
    for name in screen.unknown:
        failed[name] = NOT_REPORTED

    def gpus(node: str) -> tuple[int, ...]:
        # Asked once per bind at most, so a scan beats building an index per filter.
        try:
            return screen.gpu_indices(screen_names.index(node))
        except ValueError:
            return ()

    return Judgement(
        passing,
        failed,
        unresolvable,
        lambda: screen_priorities(screen),
        gpus,
        lambda: screen_tenths(screen)[screen.fits].tolist(),
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
