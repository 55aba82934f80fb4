"""Could the request ever fit? The line between ``unschedulable`` and ``unresolvable``.

A refusal is ``unresolvable`` when the request could not be placed even if
every node it may use were idle, healthy and available: cordoned and stale
nodes, unhealthy GPUs and busy ones are capacity that may come back. What
does not come back, as the cluster is built:

- a named node no agent has reported (``nodes: ["ghost"]``);
- a region or labels a node lacks, GPUs of another model or with less memory;
- fewer GPUs on every node than one task needs ("no node has 16 GPUs; the
  largest has 8"), fewer CPUs than ``cpus_per_task`` ("no node has 4096
  CPUs; the largest has 224"; under ``numa="required"``, on the NUMA node of
  the task's GPUs), a node design without the NVLink or NUMA set a task needs;
- a gang larger than all the nodes it may use together, idle ("the cluster
  has 76 GPUs in all; this gang needs 8000"). Per node that is the sets the
  engine itself gives an idle node, one after another, and no more tasks
  than the node's CPUs allow (under ``numa="required"``, than each NUMA node's
  GPUs and CPUs allow); the greedy choice is the engine's own, so what
  it cannot hold idle it will never be given.
- more MIG tasks than instances of the profile (of the GPU models and memory
  asked), or than their CPUs allow (as for whole GPUs);
- a task's host CPU or memory (``cpu_milli``, ``memory_mib``) above every
  node's capacity, where every node the request may use reports it (a node
  whose capacity is not known is never short).

A cluster with no node registered yet is ``unschedulable``: its agents may
be starting, and nothing is known of its capacity. A request whose own
lists leave no node (``nodes: []``, every node excluded) is
``unresolvable``.

Only refusals come here: a decision that places pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

from placement.analysis import query_for, requested_slots, unknown_names
from placement.eligibility import gpu_eligible, labels_ok, region_ok
from placement.explain import group_reasons, models
from placement.host import UNKNOWN
from placement.node_choice import NO_SET
from placement.outcome import Cause, Outcome, ReasonGroup
from placement.request import PlacementRequest
from placement.table import NodeTable

NAMES_SHOWN = 5
MIG_NOTE = " (GPUs in MIG mode are given only as MIG instances)"


def refuse(
    table: NodeTable,
    request: PlacementRequest,
    causes: Mapping[Cause, int],
    first: tuple[ReasonGroup, ...] = (),
) -> Outcome:
    """The outcome of a request that was not placed: nodes per cause grouped (``first``
    ahead of them), unknown named nodes among them, the status from capacity."""
    unknown = unknown_names(table, request)
    groups = (
        *first,
        *group_reasons(
            {**causes, Cause.NOT_REGISTERED: causes.get(Cause.NOT_REGISTERED, 0) + len(unknown)}
            if unknown
            else causes,
            request,
        ),
    )
    limit = never_fits(table, request, unknown)
    if limit is not None:
        return Outcome(status="unresolvable", reasons=groups, limit=limit)
    if not groups:
        return _nothing_to_consider(table)
    resolvable = any(g.resolvable for g in groups)
    return Outcome(status="unschedulable" if resolvable else "unresolvable", reasons=groups)


def never_fits(table: NodeTable, request: PlacementRequest, unknown: tuple[str, ...]) -> str | None:
    """Why the request could never fit the nodes it may use, or None when it could."""
    if unknown and request.nodes is not None and len(unknown) == len(set(request.nodes)):
        return _unknown_sentence(unknown)
    host = _host_limit(table, request, _scope(table, request))
    if host is not None:
        return host
    if request.mig_profile is not None:
        return _mig_limit(table, request)
    slots = _scope(table, request)
    if not slots.size:
        return None  # the per-node causes (region, labels) or the empty cluster decide
    k = request.gpus
    eligible = gpu_eligible(table, request)[slots]
    usable = table.potential[slots] & eligible
    per_node = np.bitwise_count(usable).astype(np.int64)
    most = int(per_node.max())
    if most < k:
        # GPUs in MIG mode are no whole GPUs: say so where they would have made the difference.
        with_mig = int(_with_mig(table, slots, eligible).max()) >= k
        return _gpu_sentence(request, most, with_mig)
    if request.cpus_per_task:
        cpus = int(table.cpu_count[slots].max())
        if cpus < request.cpus_per_task:
            return _cpu_sentence(request, cpus)
        if request.numa == "required":
            near = _most_numa_cpus(table, slots, usable, k)
            if near is not None and near < request.cpus_per_task:
                return _numa_cpu_sentence(request, near)
    if request.tasks == 1:
        return None
    ever = _ever_tasks(table, request, slots, usable)
    if ever >= request.tasks:
        return None
    owner, plural = _owner(request)
    total = int(per_node.sum())
    if total < request.total_gpus:
        with_mig = int(_with_mig(table, slots, eligible).sum()) >= request.total_gpus
        return (
            f"{owner} {'have' if plural else 'has'} {_gpus(total, request, with_mig)} in all;"
            f" this gang needs {request.total_gpus}" + (MIG_NOTE if with_mig else "")
        )
    return (
        f"{owner} {'hold' if plural else 'holds'} at most {ever} tasks of"
        f" {_gpus(k, request, False)}{_task_terms(request)} even when idle;"
        f" this gang needs {request.tasks}"
    )


def _host_limit(
    table: NodeTable, request: PlacementRequest, slots: NDArray[np.int64]
) -> str | None:
    """A task's host CPU or memory above every node's capacity: the node filter's
    ``host`` cause may clear as tasks end, but no task ending makes a node larger."""
    if not slots.size:
        return None
    asked = (
        (request.cpu_milli, table.host_cpu_cap[slots], "milli-CPUs of host CPU (cpu_milli)"),
        (request.memory_mib, table.host_memory_cap[slots], "MiB of host memory (memory_mib)"),
    )
    for figure, caps, unit in asked:
        if not figure or bool((caps == UNKNOWN).any()):
            continue
        most = int(caps.max())
        if most < figure:
            return f"{_subject(request)} has {figure} {unit}; the largest has {most}"
    return None


def _scope(table: NodeTable, request: PlacementRequest) -> NDArray[np.int64]:
    """The nodes the request may use: named (or all), not excluded, in its regions and labels."""
    slots = requested_slots(table, request)
    keep = region_ok(table, request.regions)[slots] & labels_ok(table, request.node_labels)[slots]
    return slots[keep]


def _ever_tasks(
    table: NodeTable,
    request: PlacementRequest,
    slots: NDArray[np.int64],
    usable: NDArray[np.int64],
) -> int:
    """Tasks the nodes could hold together when idle, as the engine would give them."""
    query = query_for(request, request.gpus)
    cpus = table.cpu_count[slots] if request.cpus_per_task else None
    memo: dict[tuple[int, int], int] = {}  # most nodes share a design and a GPU list
    total = 0
    for i, (cid, mask) in enumerate(zip(table.cid[slots].tolist(), usable.tolist(), strict=True)):
        count = memo.get((cid, mask))
        if count is None:
            count, left = 0, mask
            while True:
                chosen = table.registry.choose_one(cid, left, query)
                if chosen == NO_SET:
                    break
                count += 1
                left &= ~chosen
            memo[(cid, mask)] = count
        if cpus is not None:
            count = min(count, int(cpus[i]) // request.cpus_per_task)
            if request.numa == "required":
                rooms = _numa_rooms(table, int(slots[i]), int(usable[i]))
                count = min(count, _numa_tasks(rooms, request.gpus, request.cpus_per_task))
        total += count
        if total >= request.tasks:
            break  # enough: the rest need not be counted
    return total


def _mig_limit(table: NodeTable, request: PlacementRequest) -> str | None:
    names = request.nodes if request.nodes is not None else table.names()
    skip = set(request.exclude_nodes)
    profile = request.mig_profile
    eligible = gpu_eligible(table, request)
    count = 0  # instances the request may use
    held = 0  # of them, the tasks the nodes' CPUs allow at most
    most_cpus: int | None = None  # under numa="required": beside an instance, at most
    node_cpus = 0  # the most CPUs of a node with an instance
    for name in dict.fromkeys(names):
        entry = table.entries.get(name)
        if entry is None or name in skip:
            continue
        snap = entry.snapshot
        if request.regions and snap.region not in request.regions:
            continue
        if any(snap.labels.get(k) != v for k, v in request.node_labels.items()):
            continue
        accepted = int(eligible[entry.slot])
        parents = [
            i.parent_gpu
            for i in snap.mig_instances
            if i.profile == profile and accepted >> i.parent_gpu & 1
        ]
        count += len(parents)
        held += _mig_tasks(table, entry.slot, parents, request)
        if parents:
            node_cpus = max(node_cpus, int(table.cpu_count[entry.slot]))
        if request.cpus_per_task and request.numa == "required":
            for _, cpus in _numa_rooms(table, entry.slot, _mask(parents)):
                most_cpus = cpus if most_cpus is None else max(most_cpus, cpus)
    if held >= request.tasks:
        return None
    if count == 0:
        return f"{_subject(request)} has a MIG instance of profile {profile}{_qualifier(request)}"
    owner, plural = _owner(request)
    if count < request.tasks:
        instances = "instance" if count == 1 else "instances"
        return (
            f"{owner} {'have' if plural else 'has'} {count} MIG {instances} of profile"
            f" {profile}{_qualifier(request)} in all; this request needs {request.tasks}"
        )
    if most_cpus is not None and most_cpus < request.cpus_per_task:
        return (
            f"{_subject(request)} has {request.cpus_per_task} CPUs on the NUMA node of a MIG"
            f" instance of profile {profile} (numa required); the most is {most_cpus}"
        )
    if node_cpus < request.cpus_per_task:
        return _cpu_sentence(request, node_cpus)
    return (
        f"{owner} {'hold' if plural else 'holds'} at most {held} MIG instances of profile"
        f" {profile}{_qualifier(request)}{_task_terms(request)} even when idle;"
        f" this request needs {request.tasks}"
    )


def _mask(indices: list[int]) -> int:
    out = 0
    for i in indices:
        out |= 1 << i
    return out


def _mig_tasks(table: NodeTable, slot: int, parents: list[int], request: PlacementRequest) -> int:
    """MIG tasks a node holds at most, its instances' GPUs ``parents`` (one per instance):
    no more than its CPUs allow, under numa="required" than the CPUs of each instance's
    NUMA node allow."""
    if not request.cpus_per_task:
        return len(parents)
    if request.numa != "required":
        return min(len(parents), int(table.cpu_count[slot]) // request.cpus_per_task)
    snap = table.entry_at(slot).snapshot
    per_numa: dict[int, int] = {}
    for gpu in parents:
        numa = snap.gpus[gpu].numa_node
        if numa is not None:
            per_numa[numa] = per_numa.get(numa, 0) + 1
    rooms = [(n, len(snap.numa_cpus(numa))) for numa, n in per_numa.items()]
    return _numa_tasks(rooms, 1, request.cpus_per_task)


def _nothing_to_consider(table: NodeTable) -> Outcome:
    if not table.entries:
        empty = ReasonGroup(
            cause=Cause.NOT_REGISTERED,
            nodes=0,
            message="no nodes registered yet",
            resolvable=True,
        )
        return Outcome(status="unschedulable", reasons=(empty,))
    return Outcome(
        status="unresolvable",
        limit="no node left to consider: the request names none or excludes every one",
    )


def _numa_rooms(table: NodeTable, slot: int, mask: int) -> list[tuple[int, int]]:
    """(usable GPUs, CPUs) of each NUMA node of a node holding any of ``mask``'s GPUs.

    Under numa="required" a task's GPUs share one NUMA node and its CPUs come from that
    node alone (placement.numa); a GPU of unknown NUMA node gets none."""
    snap = table.entry_at(slot).snapshot
    gpus: dict[int, int] = {}
    for gpu in snap.gpus:
        if gpu.numa_node is not None and mask >> gpu.index & 1:
            gpus[gpu.numa_node] = gpus.get(gpu.numa_node, 0) + 1
    return [(count, len(snap.numa_cpus(numa))) for numa, count in gpus.items()]


def _numa_tasks(rooms: list[tuple[int, int]], k: int, cpus_per_task: int) -> int:
    """Tasks of ``k`` GPUs and ``cpus_per_task`` CPUs the NUMA nodes hold at most."""
    return sum(min(gpus // k, cpus // cpus_per_task) for gpus, cpus in rooms)


def _most_numa_cpus(
    table: NodeTable, slots: NDArray[np.int64], usable: NDArray[np.int64], k: int
) -> int | None:
    """The most CPUs of one NUMA node holding ``k`` usable GPUs, over the nodes; None
    where no NUMA node holds them (the design's own cause says so then)."""
    most: int | None = None
    for slot, mask in zip(slots.tolist(), usable.tolist(), strict=True):
        for gpus, cpus in _numa_rooms(table, slot, mask):
            if gpus >= k and (most is None or cpus > most):
                most = cpus
    return most


def _numa_cpu_sentence(request: PlacementRequest, most: int) -> str:
    return (
        f"{_subject(request)} has {request.cpus_per_task} CPUs on the NUMA node of"
        f" {_gpus(request.gpus, request, False)} (numa required); the most is {most}"
    )


def _with_mig(
    table: NodeTable, slots: NDArray[np.int64], eligible: NDArray[np.int64]
) -> NDArray[np.int64]:
    """Per node, the request's GPUs counting those in MIG mode too (for the words only)."""
    counts: NDArray[np.int64] = np.bitwise_count(table.every_gpu[slots] & eligible).astype(np.int64)
    return counts


def _subject(request: PlacementRequest) -> str:
    if request.nodes is not None:
        return "no named node"
    if request.regions or request.node_labels or request.exclude_nodes:
        return "no matching node"
    return "no node"


def _owner(request: PlacementRequest) -> tuple[str, bool]:
    """What holds the request's capacity, and whether it is plural."""
    if request.nodes is not None:
        return "the named nodes", True
    if request.regions or request.node_labels or request.exclude_nodes:
        return "the matching nodes", True
    return "the cluster", False


def _qualifier(request: PlacementRequest) -> str:
    out = ""
    if request.gpu_models:
        out += f" of model {models(request)}"
    if request.min_gpu_memory_mib:
        out += f" with at least {request.min_gpu_memory_mib} MiB"
    return out


def _gpus(n: int, request: PlacementRequest, whole: bool) -> str:
    noun = "whole GPU" if whole else "GPU"
    return f"{n} {noun}{'' if n == 1 else 's'}{_qualifier(request)}"


def _task_terms(request: PlacementRequest) -> str:
    terms = []
    if request.locality == "nvlink" and request.gpus > 1:
        terms.append("connected by NVLink")
    if request.numa == "required":
        terms.append("on one NUMA node")
    if request.cpus_per_task:
        terms.append(f"with {request.cpus_per_task} CPUs each")
    return f" ({', '.join(terms)})" if terms else ""


def _gpu_sentence(request: PlacementRequest, most: int, whole: bool) -> str:
    subject = _subject(request)
    if most == 0:
        text = f"{subject} has {'a whole GPU' if whole else 'a GPU'}{_qualifier(request)}"
    else:
        largest = "the most on one node is" if _qualifier(request) else "the largest has"
        text = f"{subject} has {_gpus(request.gpus, request, whole)}; {largest} {most}"
    return text + (MIG_NOTE if whole else "")


def _cpu_sentence(request: PlacementRequest, most: int) -> str:
    subject = _subject(request)
    if most == 0:
        return f"{subject} reports its CPUs (NUMA nodes), so none can be reserved for a task"
    return f"{subject} has {request.cpus_per_task} CPUs; the largest has {most}"


def _unknown_sentence(unknown: tuple[str, ...]) -> str:
    if len(unknown) == 1:
        return f"no topoplace agent has reported a node named {unknown[0]}"
    shown = ", ".join(unknown[:NAMES_SHOWN]) + (", ..." if len(unknown) > NAMES_SHOWN else "")
    return f"no topoplace agent has reported any of the {len(unknown)} named nodes ({shown})"
