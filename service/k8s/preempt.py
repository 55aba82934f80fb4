"""Preempt: keep only the nodes where evicting the proposed victims would let the pod fit.

kube-scheduler proposes, per node, the pods it would evict; it counts GPUs,
not wiring. Freeing 4 GPUs scattered over two NVLink islands does not give
an ``nvlink`` pod its 4 connected GPUs, so evicting there would hurt others
for nothing. For each node we free, in memory, what the victims hold there
(their topoplace reservations, found by pod UID), ask the engine again, and
put everything back before the state lock is released. Gangs are passed
through unchanged: one node's victims cannot decide a multi-node placement.
"""

from __future__ import annotations

from service.allocations import service as allocations
from service.k8s.gang import LIVE
from service.k8s.pod_request import PodRequest
from service.k8s.screening import judge_mig, judge_screen
from service.k8s.wire import MetaPod, MetaVictims, Victims
from service.state import ServiceState


def meta_victims(
    full: dict[str, Victims] | None, meta: dict[str, MetaVictims] | None
) -> dict[str, MetaVictims]:
    """The victims by UID whichever form came (Meta when nodeCacheCapable)."""
    if meta:
        return meta
    out: dict[str, MetaVictims] = {}
    for node, victims in (full or {}).items():
        pods = [
            MetaPod(UID=str((p.get("metadata") or {}).get("uid", "")))
            for p in victims.get("Pods") or []
        ]
        out[node] = MetaVictims(Pods=pods, NumPDBViolations=int(victims.get("NumPDBViolations", 0)))
    return out


def _held(state: ServiceState, uids: list[str], node: str) -> tuple[set[str], set[str]]:
    gpus: set[str] = set()
    migs: set[str] = set()
    for uid in uids:
        for allocation in allocations.listing(state, uid, node, None, 100):
            if allocation["state"] not in LIVE:
                continue
            for task in allocation["tasks"]:
                if task["node"] != node:
                    continue
                if task["mig_uuids"]:
                    migs |= set(task["mig_uuids"])
                else:
                    gpus |= set(task["gpu_uuids"])
    return gpus, migs


def useful(
    state: ServiceState, pod: PodRequest, victims: dict[str, MetaVictims]
) -> dict[str, MetaVictims]:
    """The subset of ``victims`` whose eviction would let the pod fit on that node."""
    request = pod.request
    if request is None or pod.gang is not None:
        return victims
    out: dict[str, MetaVictims] = {}
    for node, proposal in victims.items():
        uids = [p.get("UID", "") for p in proposal.get("Pods") or []]
        gpus, migs = _held(state, uids, node)
        with state.lock:
            cluster = state.cluster
            if node not in cluster:
                continue
            entry = cluster.node(node)
            gpus &= set(entry.busy)
            migs &= set(entry.busy_mig)
            cluster.release(node, gpus, migs)
            try:
                if pod.screened:
                    fits = bool(judge_screen(cluster, request, [node]).passing)
                else:
                    fits = bool(judge_mig(cluster, request, [node]).passing)
            finally:
                cluster.allocate(node, gpus, migs)
        if fits:
            out[node] = proposal
    return out
