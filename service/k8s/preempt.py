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

from typing import Any

from placement.text import forbidden_character
from service.allocations import api as allocations
from service.errors import BadRequest
from service.k8s.gang import LIVE
from service.k8s.pod_request import PodRequest
from service.k8s.screening import judge_mig, judge_screen
from service.k8s.wire import MAX_VIOLATIONS, MetaPod, MetaVictims
from service.state import ServiceState


def meta_victims(full: Any, meta: Any) -> dict[str, MetaVictims]:
    """The victims by UID whichever form came (Meta when nodeCacheCapable); 400 when
    either is not the shape kube-scheduler sends."""
    out: dict[str, MetaVictims] = {}
    meta_form = bool(meta)
    for node, victims in _per_node(meta if meta_form else full).items():
        pods = victims.get("Pods") or []
        violations = victims.get("NumPDBViolations", 0)
        if isinstance(violations, float) and violations.is_integer():
            violations = int(violations)  # JSON's 2.0 is the integer 2
        if not isinstance(pods, list) or not all(isinstance(p, dict) for p in pods):
            raise BadRequest(f"the victims on {node!r}: Pods must be a list of objects")
        if (
            isinstance(violations, bool)
            or not isinstance(violations, int)
            or not 0 <= violations <= MAX_VIOLATIONS
        ):
            raise BadRequest(f"the victims on {node!r}: NumPDBViolations must be a count")
        if meta_form:
            uids = [str(p.get("UID", "")) for p in pods]
        else:
            uids = [_uid(p.get("metadata")) for p in pods]
        _plain(node, uids)
        out[node] = MetaVictims(Pods=[MetaPod(UID=u) for u in uids], NumPDBViolations=violations)
    return out


def _uid(metadata: Any) -> str:
    """A full Pod victim's UID; none when its metadata is not an object."""
    return str(metadata.get("uid", "")) if isinstance(metadata, dict) else ""


def _plain(node: str, uids: list[str]) -> None:
    """400 for a control character in a node name or UID: both are looked up in the
    database (Postgres refuses NUL in any parameter) and neither can name a real one."""
    if forbidden_character(node) is not None:
        raise BadRequest(f"the victims' node name {node!r} carries control characters")
    if any(forbidden_character(uid) is not None for uid in uids):
        raise BadRequest(f"the victims on {node!r}: a pod's UID carries control characters")


def _per_node(victims: Any) -> dict[str, dict[str, Any]]:
    if victims is None:
        return {}
    if not isinstance(victims, dict) or not all(isinstance(v, dict) for v in victims.values()):
        raise BadRequest("the victims must be an object of node names to Victims objects")
    return victims


def _held(state: ServiceState, uids: list[str], node: str) -> tuple[set[str], set[str]]:
    gpus: set[str] = set()
    migs: set[str] = set()
    for uid in uids:
        for allocation in allocations.listing(state, uid, node, None, 100):
            if allocation.state not in LIVE:
                continue
            for task in allocation.tasks:
                if task.node != node:
                    continue
                if task.mig_uuids:
                    migs |= set(task.mig_uuids)
                else:
                    gpus |= set(task.gpu_uuids)
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
            gpus &= entry.held_gpus
            migs &= entry.held_migs
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
