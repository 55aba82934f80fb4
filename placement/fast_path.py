"""The /place hot path: per-node answers cached per request shape, per slot.

A request's "shape" is what decides each node's answer on its own (GPUs per
task, locality, NUMA rule, objective, policy, GPU model and memory). For
each shape we keep, per node slot, the chosen set, its metrics and a primary
ranking key, stamped with the slot's version. A decision then recomputes
only the slots whose version moved since the last decision of that shape
(usually the one or two nodes the previous decision and release touched),
and ranks 10,000 nodes with a max over the first packed ranking word, then
over the next words among the few nodes tied on it. What does not change a
node's answer (named candidate nodes, regions, labels, excluded nodes) is
applied at selection time, over the same cached words: a Slurm partition
is a list of names on every submission.

What it costs: ~70 bytes per slot per shape, at most MAX_SHAPES shapes (the
oldest is dropped). What it does not do: gangs, MIG,
waiting-gang protection and failures fall back to the full path in
``decide``, which also produces the grouped reasons. Both paths share
``analyse`` and ``rank_words``, so they agree (a test checks it).
"""

from __future__ import annotations

import heapq

import numpy as np
from numpy.typing import NDArray

from placement.analysis import analyse, query_for, requested_slots
from placement.eligibility import gpu_eligible, labels_ok, region_ok
from placement.node_choice import NO_SET
from placement.outcome import TaskPlacement
from placement.ranking import RankInputs, best_of, pack_words, rank_columns, rank_words
from placement.request import PlacementRequest
from placement.shape_cache import NONE, PER_SLOT, ShapeCache
from placement.table import NodeTable
from placement.task_builder import build_task, score_parts

SCALAR_LIMIT = 8  # below this many stale slots, per-node Python beats numpy's call overhead


def _stale_slots(table: NodeTable, cache: ShapeCache) -> list[int]:
    n = table.slot_count
    touched = table.touched_since(cache.seen)
    if touched is None:
        stale: list[int] = np.flatnonzero(cache.version[:n] != table.slot_version[:n]).tolist()
        return stale
    return touched


# One node's cached answer: fits, then PER_SLOT's fields, then what the rank words need.
_Row = tuple[bool, int, float, float, float, float, int, int, bool]


def _refresh(table: NodeTable, cache: ShapeCache) -> None:
    if cache.seen == table.clock:
        return
    stale = _stale_slots(table, cache)
    cache.seen = table.clock
    if not stale:
        return
    if len(stale) <= SCALAR_LIMIT:
        _store_few(table, cache, stale)
    else:
        at = np.asarray(stale, dtype=np.int64)
        words = _store_many(table, cache, at)
        _words_for(cache, len(words))
        for i, stored in enumerate(cache.words):
            stored[at] = words[i]
        cache.version[at] = table.slot_version[at]
    _push(cache, stale)


def _words_for(cache: ShapeCache, count: int) -> None:
    """The cache's word arrays, made on first use (their number depends on the shape)."""
    if not cache.words:
        size = cache.version.size
        cache.words = [np.full(size, NONE if i == 0 else 0, dtype=np.int64) for i in range(count)]


def _store_few(table: NodeTable, cache: ShapeCache, stale: list[int]) -> None:
    """A handful of stale slots (the usual decision): stored slot by slot, as plain
    numbers; numpy's fancy indexing costs more per call than the few values it sets."""
    rows = _rows_few(table, cache.shape, stale)
    per_slot = _words_few(rows, cache.shape)
    _words_for(cache, len(per_slot[0]))
    fields = [getattr(cache, name) for name in PER_SLOT]
    versions = table.slot_version
    for slot, row, words in zip(stale, rows, per_slot, strict=True):
        for stored, value in zip(fields, row[1:8], strict=True):
            stored[slot] = value
        for stored, word in zip(cache.words, words, strict=True):
            stored[slot] = word
        cache.version[slot] = versions[slot]


def _push(cache: ShapeCache, stale: list[int]) -> None:
    """Keep the heap in step with the words; rebuilt when mostly stale entries remain.

    A few hundred changed nodes (a sweep that ended hundreds of reservations)
    are pushed one by one: rebuilding the heap of every node for them stalled
    the next decision for tens of milliseconds at 10,000 nodes.
    """
    size = cache.version.size
    if 4 * len(stale) > size or len(cache.heap) > 4 * size + 64:
        live = np.flatnonzero(cache.words[0] != NONE)
        columns = [(-w[live]).tolist() for w in cache.words]
        cache.heap = list(zip(*columns, live.tolist(), cache.version[live].tolist(), strict=True))
        heapq.heapify(cache.heap)
        return
    for slot in stale:
        if cache.words[0][slot] != NONE:
            entry = (*(-int(w[slot]) for w in cache.words), slot, int(cache.version[slot]))
            heapq.heappush(cache.heap, entry)


def _heap_best(cache: ShapeCache) -> int | None:
    """The best slot, in O(log n): stale entries on top are popped and forgotten."""
    heap = cache.heap
    while heap:
        top = heap[0]
        slot, version = top[-2], top[-1]
        if cache.version[slot] == version and cache.words[0][slot] != NONE:
            return slot
        heapq.heappop(heap)
    return None


def _store_many(
    table: NodeTable, cache: ShapeCache, stale: NDArray[np.int64]
) -> list[NDArray[np.int64]]:
    """Many stale slots (a new shape, churn): the array path, stored; returns the rank words."""
    shape = cache.shape
    a = analyse(table, shape, shape.gpus, stale)
    for name in PER_SLOT:
        getattr(cache, name)[stale] = getattr(a, name)
    inputs = RankInputs(
        ring=a.ring,
        pair=a.pair,
        quality=a.quality,
        fragmentation=a.fragmentation,
        connected=a.connected,
        free_after=a.free_after,
        gpu_count=a.gpu_count,
        protected=np.zeros(stale.size, dtype=np.bool_),  # protection takes the full path
    )
    words = rank_words(inputs, shape)
    words[0] = np.where(a.fits() & table.present[stale], words[0], NONE)
    return words


def _words_few(rows: list[_Row], shape: PlacementRequest) -> list[list[int]]:
    """Per row, its rank words; the first is NONE where the node does not fit."""
    per_slot = []
    for fits, _, ring, pair, quality, frag, _, free_after, conn in rows:
        words = pack_words(rank_columns(ring, pair, quality, frag, conn, free_after, False, shape))
        if not fits:
            words[0] = int(NONE)
        per_slot.append(words)
    return per_slot


def _rows_few(table: NodeTable, shape: PlacementRequest, slots: list[int]) -> list[_Row]:
    """``analyse`` for a handful of slots, one node at a time in plain Python.

    Same checks in the same order as ``analyse`` (a test holds the two paths
    to the same answers); it only tells fit from no fit, which is all the
    cache needs.
    """
    k = shape.gpus
    query = query_for(shape, k)
    reg = table.registry
    constrained = bool(shape.gpu_models) or shape.min_gpu_memory_mib > 0
    eligible = gpu_eligible(table, shape) if constrained else None
    rows: list[_Row] = []
    for slot in slots:
        cid = int(table.cid[slot])
        elig = -1 if eligible is None else int(eligible[slot])
        free_live = int(table.free[slot])
        potential = int(table.potential[slot]) & elig
        ideal = NO_SET if potential.bit_count() < k else reg.choose_one(cid, potential, query)
        fits = (
            ideal != NO_SET
            and bool(table.present[slot])
            and bool(table.available[slot])
            and (int(table.healthy[slot]) & elig).bit_count() >= k
            and (free_live & elig).bit_count() >= k
        )
        chosen = reg.choose_one(cid, free_live & elig, query) if fits else NO_SET
        if chosen == NO_SET:
            rows.append((False, NO_SET, 0.0, 0.0, 0.0, 0.0, 0, 0, False))
            continue
        ring, pair, connected, span = reg.set_metrics(cid, chosen)
        ideal_ring = reg.set_metrics(cid, ideal)[0]
        before = reg.capability_of(cid, free_live)
        after = reg.capability_of(cid, free_live & ~chosen)
        rows.append(
            (
                True,
                chosen,
                ring,
                pair,
                min(ring / ideal_ring, 1.0) if ideal_ring > 0 else 1.0,
                min(max(after / before, 0.0), 1.0) if before > 0 else 1.0,
                span,
                free_live.bit_count() - k,
                connected,
            )
        )
    return rows


def fast_place(table: NodeTable, request: PlacementRequest) -> TaskPlacement | None:
    """The best node's task for a single-task whole-GPU request, or None to use the full path."""
    cache = table.shape_caches.get(request, table.slot_count)
    _refresh(table, cache)
    n = table.slot_count
    if not n or not cache.words:
        return None
    filtered = request.regions or request.node_labels or request.exclude_nodes
    if request.nodes is None and not filtered:
        best = _heap_best(cache)
        return None if best is None else _task(table, cache, request, best)
    # Named candidates (a Slurm partition, an operator's list) or filters: the best of
    # the slots that pass, from the same cached words. Ascending slots, as the heap's
    # tie-break and the full path's.
    slots = requested_slots(table, request) if request.nodes is not None else None
    first = cache.words[0][:n] if slots is None else cache.words[0][slots]
    if request.regions:
        first = np.where(_at(region_ok(table, request.regions), n, slots), first, NONE)
    if request.node_labels:
        first = np.where(_at(labels_ok(table, request.node_labels), n, slots), first, NONE)
    if request.exclude_nodes and slots is None:  # requested_slots drops them from a list
        first = first.copy()
        # The names this table knows, found in C: a loop over the list in Python took
        # 29 ms for 65,536 names, most of them of no node here.
        for name in table.entries.keys() & request.exclude_nodes:
            first[table.entries[name].slot] = NONE
    if not first.size or (top := first.max()) == NONE:
        return None
    tied = np.flatnonzero(first == top).astype(np.int64)
    if slots is not None:
        tied = slots[tied]
    return _task(table, cache, request, best_of(cache.words[1:], tied))


def _at(mask: NDArray[np.bool_], n: int, slots: NDArray[np.int64] | None) -> NDArray[np.bool_]:
    """A per-slot mask, over every slot or over the named ones."""
    return mask[:n] if slots is None else mask[slots]


def _task(
    table: NodeTable, cache: ShapeCache, request: PlacementRequest, slot: int
) -> TaskPlacement | None:
    parts = score_parts(cache, slot)
    return build_task(table, slot, int(cache.chosen[slot]), request, 0, parts)
