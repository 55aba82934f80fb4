"""Every candidate node's answer for one task shape, as arrays.

For a task of k GPUs this computes, for all requested nodes at once: why a
node cannot take it (the first failing check, in the order a person would
look: static constraints, node design (GPUs, NVLink or NUMA sets, CPUs),
availability, health, free GPUs, topology now), and for the rest the exact
set the node would give with its ring, pair bandwidth, quality and
fragmentation. Exact classes are served by gathers from the class
registry's answer tables; nodes with more than 16 GPUs by the greedy
search, one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from itertools import repeat

import numpy as np
from numpy.typing import NDArray

from placement.eligibility import (
    gpu_eligible,
    labels_ok,
    model_matches,
    model_pressure,
    region_ok,
)
from placement.host import free_room, stranded_added
from placement.node_choice import NO_SET, SetQuery
from placement.numa import gpus_beside_free_cpus
from placement.outcome import Cause
from placement.ranking import RankInputs
from placement.request import PlacementRequest
from placement.table import FULL_SHARE, NodeTable
from placement.task_mix import expected_added, room_stats

CAUSES: tuple[Cause, ...] = tuple(Cause)
_CODE = {c: i for i, c in enumerate(CAUSES)}
FITS = -1

I64 = NDArray[np.int64]


def query_for(request: PlacementRequest, k: int) -> SetQuery:
    return SetQuery(
        k=k,
        require_nvlink=request.locality == "nvlink" and k > 1,
        numa_required=request.numa == "required",
        balanced=request.objective == "balanced",
        max_ring_loss=request.max_ring_loss if request.objective == "balanced" else 0.0,
    )


@dataclass
class Analysis:
    slots: I64
    cause: I64  # FITS or an index into CAUSES
    chosen: I64  # set mask, NO_SET where the node does not fit
    ring: NDArray[np.float64]
    pair: NDArray[np.float64]
    connected: NDArray[np.bool_]
    numa_span: I64
    quality: NDArray[np.float64]
    fragmentation: NDArray[np.float64]
    free_after: I64
    gpu_count: I64
    # GPUs the choice strands for want of host CPU or memory (placement.host); zeros
    # for a request without host figures, whose ranking does not read it.
    stranded: NDArray[np.float64]
    # GPUs of expected fragmentation the choice adds under the task mix
    # (placement.task_mix); None without host figures or while the mix is empty.
    expected: NDArray[np.float64] | None = None

    def fits(self) -> NDArray[np.bool_]:
        return np.asarray(self.cause == FITS, dtype=np.bool_)

    def cause_counts(self) -> dict[Cause, int]:
        """How many nodes fail for each cause (causes no node has are left out).

        Counted by code in numpy: a refusal at 10,000 nodes would otherwise
        build and count a Cause per node.
        """
        counts = np.bincount(self.cause[self.cause != FITS], minlength=len(CAUSES)).tolist()
        return {CAUSES[code]: n for code, n in enumerate(counts) if n}

    def rank_inputs(
        self, sel: NDArray[np.bool_], table: NodeTable, protected: NDArray[np.bool_]
    ) -> RankInputs:
        pressed = model_pressure(table)
        return RankInputs(
            ring=self.ring[sel],
            pair=self.pair[sel],
            quality=self.quality[sel],
            fragmentation=self.fragmentation[sel],
            connected=self.connected[sel],
            free_after=self.free_after[sel],
            gpu_count=self.gpu_count[sel],
            protected=protected[self.slots[sel]],
            stranded=self.stranded[sel],
            expected=None if self.expected is None else self.expected[sel],
            pressure=None if pressed is None else pressed[self.slots[sel]],
        )

    def set_cause(self, index: int, cause: Cause) -> None:
        self.cause[index] = _CODE[cause]
        self.chosen[index] = NO_SET


def requested_slots(table: NodeTable, request: PlacementRequest) -> I64:
    if request.nodes is None:
        slots = np.flatnonzero(table.present[: table.slot_count]).astype(np.int64)
    elif table.last_candidates is not None and table.last_candidates[0] == request.nodes:
        # The same list as last time, and no node came or went since (membership
        # changes forget it): comparing names is several times cheaper than looking
        # each up again.
        slots = table.last_candidates[1]
    else:
        # Schedulers send thousands of names per call: map() looks them up in C, and a mask
        # over the slots drops duplicates and sorts (slot order breaks ties) in O(slots),
        # several times cheaper than np.unique's sort for 10,000 names.
        found = np.fromiter(
            map(table.slot_of.get, request.nodes, repeat(-1)),
            dtype=np.int64,
            count=len(request.nodes),
        )
        mask = np.zeros(table.slot_count, dtype=np.bool_)
        mask[found[found >= 0]] = True
        slots = np.flatnonzero(mask).astype(np.int64)
        table.last_candidates = (request.nodes, slots)
    if request.exclude_nodes:
        drop = {table.entries[n].slot for n in request.exclude_nodes if n in table.entries}
        slots = np.asarray([s for s in slots.tolist() if s not in drop], dtype=np.int64)
    return slots


def unknown_names(table: NodeTable, request: PlacementRequest) -> tuple[str, ...]:
    """The named nodes no agent has reported, each once, in the request's order."""
    if request.nodes is None:
        return ()
    slot_of = table.slot_of
    # The usual call names only known nodes: one pass in C says so, without the ordered
    # de-duplication (a dict of 10,000 names) that only a missing name needs.
    if all(map(slot_of.__contains__, request.nodes)):
        return ()
    return tuple(n for n in dict.fromkeys(request.nodes) if n not in slot_of)


def analyse(
    table: NodeTable,
    request: PlacementRequest,
    k: int,
    slots: I64,
    free_all: I64 | None = None,
    need: float | None = None,
    planned: int = 0,
    planned_cpus: Mapping[int, Collection[int]] | None = None,
) -> Analysis:
    """free_all: per-slot free masks to use instead of the live ones (gang planning);
    planned: tasks of this request already planned on each node (gang planning: their
    host CPU and memory count as used);
    planned_cpus: slot -> CPUs this request's earlier tasks take there (gang planning:
    the NUMA rule counts them as used).
    need: the GPU capacity the task takes, where it is not k whole GPUs (a share opening
    a whole GPU takes its fraction), for the host term."""
    q = query_for(request, k)
    free_all = table.free if free_all is None else free_all
    # What a request does not constrain is not computed: every GPU is eligible and every
    # present node passes an empty region or label filter (the check would change nothing).
    constrained = bool(request.gpu_models) or request.min_gpu_memory_mib > 0
    potential_all = table.potential[slots]
    free_live = free_all[slots]
    healthy = table.healthy[slots]
    if constrained:
        elig = gpu_eligible(table, request)[slots]
        potential, free, healthy = potential_all & elig, free_live & elig, healthy & elig
    else:
        potential, free = potential_all, free_live
    cause = np.full(slots.size, FITS, dtype=np.int64)

    def mark(cond: NDArray[np.bool_], why: Cause) -> None:
        cause[(cause == FITS) & cond] = _CODE[why]

    if request.regions:
        mark(~region_ok(table, request.regions)[slots], Cause.REGION)
    if request.node_labels:
        mark(~labels_ok(table, request.node_labels)[slots], Cause.LABELS)
    too_few = np.bitwise_count(potential) < k
    if request.gpu_models:
        models = potential_all & model_matches(table, request)[slots]
        mark(too_few & (np.bitwise_count(models) < k), Cause.GPU_MODEL)
    if request.min_gpu_memory_mib:
        mark(too_few & (np.bitwise_count(potential_all) >= k), Cause.GPU_MEMORY)
    mark(too_few & (np.bitwise_count(table.every_gpu[slots]) >= k), Cause.MIG_MODE)
    mark(too_few, Cause.TOO_FEW_GPUS)

    cids = table.cid[slots]
    ideal = _choose(table, q, cids, potential, cause == FITS)
    never = Cause.NO_NVLINK_SET_EVER if q.require_nvlink else Cause.NO_NUMA_SET_EVER
    mark(ideal == NO_SET, never)
    if request.cpus_per_task:
        # Before availability: a cordoned node too small for one task stays too small.
        mark(table.cpu_count[slots] < request.cpus_per_task, Cause.TOO_FEW_CPUS)
    mark(~table.available[slots], Cause.UNAVAILABLE)
    mark(np.bitwise_count(healthy) < k, Cause.UNHEALTHY)
    mark(np.bitwise_count(free) < k, Cause.BUSY)
    chosen = _choose(table, q, cids, free, cause == FITS)
    now = Cause.NO_NVLINK_SET_NOW if q.require_nvlink else Cause.NO_NUMA_SET_NOW
    mark(chosen == NO_SET, now)
    if request.cpus_per_task and q.numa_required:
        chosen = _with_cpus(
            table, request, q, cids, slots, free, chosen, cause == FITS, planned_cpus or {}
        )
        mark(chosen == NO_SET, Cause.CPUS)
    stranded = np.zeros(slots.size)
    expected: NDArray[np.float64] | None = None
    if request.counts_host:
        gpus_taken = k if need is None else need
        stranded = _host(table, request, gpus_taken, slots, free_live, mark, planned)
        fits = cause == FITS
        # A share opening a whole GPU leaves the rest of it free, shared.
        left = 0 if need is None else round((k - need) * FULL_SHARE)
        expected = _expected(table, request, k, left, slots[fits], free_live[fits], planned)
        if expected is not None:
            # Only the nodes that fit are ranked: the others need no figure.
            expected = _spread(expected, fits)
    chosen = np.where(cause == FITS, chosen, NO_SET)

    ring, pair, connected, span, ideal_ring, cap_before, cap_after = _metrics(
        table, cids, chosen, ideal, free_live
    )
    quality = np.where(ideal_ring > 0, ring / np.where(ideal_ring > 0, ideal_ring, 1.0), 1.0)
    fragmentation = np.where(
        cap_before > 0, cap_after / np.where(cap_before > 0, cap_before, 1.0), 1.0
    )
    return Analysis(
        slots=slots,
        cause=cause,
        chosen=chosen,
        ring=ring,
        pair=pair,
        connected=connected,
        numa_span=span,
        quality=np.minimum(quality, 1.0),
        fragmentation=np.clip(fragmentation, 0.0, 1.0),
        free_after=np.bitwise_count(free_live).astype(np.int64) - k,
        gpu_count=np.bitwise_count(potential_all).astype(np.int64),
        stranded=stranded,
        expected=expected,
    )


def _host(
    table: NodeTable,
    request: PlacementRequest,
    k: float,
    slots: I64,
    free_live: I64,
    mark: Callable[[NDArray[np.bool_], Cause], None],
    planned: int = 0,
) -> NDArray[np.float64]:
    """Refuse nodes whose known free host CPU or memory is below the task's; return the
    GPUs each choice would strand. The known use counts only tasks that carried host
    figures, so it is a lower bound of the true use and the known free room an upper
    bound of the true room: a node refused here truly lacks the room, and a node that
    truly fits is never refused."""
    cpu, memory = request.cpu_milli or 0, request.memory_mib or 0
    cpu_free = free_room(table.host_cpu_cap[slots], table.host_cpu_used[slots]) - planned * cpu
    memory_free = (
        free_room(table.host_memory_cap[slots], table.host_memory_used[slots]) - planned * memory
    )
    mark((cpu_free < cpu) | (memory_free < memory), Cause.HOST)
    gpus = free_gpus(table, slots, free_live)
    per_gpu = table.host_mix.per_gpu()
    added: NDArray[np.float64] = stranded_added(
        gpus, k, cpu_free, memory_free, cpu, memory, per_gpu
    )
    return added


def _expected(
    table: NodeTable,
    request: PlacementRequest,
    k: int,
    left: int,
    slots: I64,
    free_live: I64,
    planned: int = 0,
) -> NDArray[np.float64] | None:
    """The expected fragmentation each node's choice adds (placement.task_mix), in GPUs;
    None while the mix has no type. Nodes that do not fit get a figure the ranking never
    reads."""
    mix = table.task_mix.arrays()
    if mix is None:
        return None
    cpu, memory = request.cpu_milli or 0, request.memory_mib or 0
    cpu_free = free_room(table.host_cpu_cap[slots], table.host_cpu_used[slots]) - planned * cpu
    memory_free = (
        free_room(table.host_memory_cap[slots], table.host_memory_used[slots]) - planned * memory
    )
    below, largest = _room_stats(table, slots, mix.sizes)
    whole = np.bitwise_count(free_live).astype(np.int64)
    room = table.share_room[slots].astype(np.float64)
    return expected_added(
        mix, whole, k, room, largest, below, cpu_free, memory_free, cpu, memory, left
    )


def _spread(values: NDArray[np.float64], at: NDArray[np.bool_]) -> NDArray[np.float64]:
    out = np.zeros(at.size)
    out[at] = values
    return out


def _room_stats(
    table: NodeTable, slots: I64, sizes: NDArray[np.int64]
) -> tuple[NDArray[np.float64], I64]:
    """Per slot, its shared GPUs' room below each share size and their largest room,
    recomputed only for the slots that changed since (or for every slot when the mix's
    share sizes change): a decision touches one node, and every decision reads them all."""
    n = table.slot_count
    key = tuple(sizes.tolist())
    cache = table.room_cache
    if cache is None or cache[0] != key or cache[3].size < n:
        cap = max(n, table.slot_version.size)
        cache = (
            key,
            np.zeros((cap, sizes.size)),
            np.zeros(cap, dtype=np.int64),
            np.full(cap, -1, dtype=np.int64),
        )
        table.room_cache = cache
    _, below, largest, stamp = cache
    version = table.slot_version[slots]
    for slot in slots[stamp[slots] != version].tolist():
        healthy = int(table.healthy[slot])  # as share_room: no room on an unhealthy GPU
        shared = table.shared.get(slot, {}).items()
        rooms = [FULL_SHARE - held for gpu, held in shared if healthy >> gpu & 1]
        below[slot], largest[slot] = room_stats(rooms, sizes)
        stamp[slot] = table.slot_version[slot]  # after the row: a reader sees both or neither
    return below[slots], largest[slots]


def free_gpus(table: NodeTable, slots: I64, free_live: I64) -> NDArray[np.float64]:
    """Free GPU capacity per node, as the trace and FGD count it: whole free GPUs plus
    the room left on shared ones."""
    whole = np.bitwise_count(free_live).astype(np.float64)
    return whole + table.share_room[slots] / FULL_SHARE


def _with_cpus(
    table: NodeTable,
    request: PlacementRequest,
    q: SetQuery,
    cids: I64,
    slots: I64,
    free: I64,
    chosen: I64,
    fits: NDArray[np.bool_],
    planned_cpus: Mapping[int, Collection[int]],
) -> I64:
    """``chosen``, where a node's best set cannot get the CPUs asked under numa="required",
    replaced by its best set among the GPUs whose NUMA node has them (NO_SET: none).

    Without this the node was refused for CPUs while another of its NUMA nodes had the
    GPUs and the CPUs free. A set that can get its CPUs is kept as it is, so the choice
    only changes where it would have been refused."""
    out = chosen.copy()
    for i in np.flatnonzero(fits & (chosen != NO_SET)).tolist():
        slot = int(slots[i])
        entry = table.entry_at(slot)
        planned = planned_cpus.get(slot)
        used = entry.used_cpus | set(planned) if planned else entry.used_cpus
        near = gpus_beside_free_cpus(entry.snapshot, request.cpus_per_task, used)
        if int(chosen[i]) & ~near:
            masks = np.array([int(free[i]) & near], dtype=np.int64)
            out[i] = _choose(table, q, cids[i : i + 1], masks, np.ones(1, dtype=np.bool_))[0]
    return out


def _choose(table: NodeTable, q: SetQuery, cids: I64, masks: I64, active: NDArray[np.bool_]) -> I64:
    out = np.full(cids.size, NO_SET, dtype=np.int64)
    reg = table.registry
    offsets = reg.offsets[cids]
    exact = active & (offsets >= 0)
    if exact.any():
        out[exact] = reg.choose(q, offsets[exact] + masks[exact])
    for i in np.flatnonzero(active & (offsets < 0)).tolist():
        out[i] = reg.choose_one(int(cids[i]), int(masks[i]), q)
    return out


def _metrics(
    table: NodeTable, cids: I64, chosen: I64, ideal: I64, free_live: I64
) -> tuple[
    NDArray[np.float64],
    NDArray[np.float64],
    NDArray[np.bool_],
    I64,
    NDArray[np.float64],
    NDArray[np.float64],
    NDArray[np.float64],
]:
    reg = table.registry
    n = cids.size
    ring = np.zeros(n)
    pair = np.zeros(n)
    connected = np.zeros(n, dtype=np.bool_)
    span = np.zeros(n, dtype=np.int64)
    ideal_ring = np.zeros(n)
    cap_before = np.zeros(n)
    cap_after = np.zeros(n)
    offsets = reg.offsets[cids]
    fits = chosen != NO_SET
    exact = fits & (offsets >= 0)
    if exact.any():
        at = offsets[exact] + chosen[exact]
        ring[exact] = reg.ring[at]
        pair[exact] = reg.pair[at]
        connected[exact] = reg.connected[at]
        span[exact] = reg.numa_span[at]
        ideal_ring[exact] = reg.ring[offsets[exact] + ideal[exact]]
        cap_before[exact] = reg.capability[offsets[exact] + free_live[exact]]
        cap_after[exact] = reg.capability[offsets[exact] + (free_live[exact] & ~chosen[exact])]
    for i in np.flatnonzero(fits & (offsets < 0)).tolist():
        cid, mask = int(cids[i]), int(chosen[i])
        ring[i], pair[i], connected[i], span[i] = reg.set_metrics(cid, mask)
        ideal_ring[i] = reg.set_metrics(cid, int(ideal[i]))[0]
        cap_before[i] = reg.capability_of(cid, int(free_live[i]))
        cap_after[i] = reg.capability_of(cid, int(free_live[i]) & ~mask)
    return ring, pair, connected, span, ideal_ring, cap_before, cap_after
