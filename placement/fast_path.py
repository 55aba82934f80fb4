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
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from placement.analysis import analyse, query_for, requested_slots
from placement.eligibility import gpu_eligible, labels_ok, region_ok
from placement.node_choice import NO_SET
from placement.ranking import RankInputs, best_of, pack_words, rank_columns, rank_words
from placement.request import PlacementRequest

if TYPE_CHECKING:
    from placement.cluster import ClusterState
    from placement.outcome import TaskPlacement

MAX_SHAPES = 64
SCALAR_LIMIT = 8  # below this many stale slots, per-node Python beats numpy's call overhead
_NONE = np.iinfo(np.int64).min


# Request fields that never change a node's own answer, with the neutral
# value a shape gets. They are filtered at selection time or ignored here;
# every other field of PlacementRequest is part of the shape.
_PER_REQUEST: dict[str, object] = {
    "regions": (),
    "node_labels": {},
    "nodes": None,
    "exclude_nodes": (),
    "job_id": None,
    "cpus_per_task": 0,
    "tasks": 1,
}
_SHAPE_FIELDS = tuple(f for f in PlacementRequest.model_fields if f not in _PER_REQUEST)


def shape_of(request: PlacementRequest) -> PlacementRequest:
    """The request with everything that does not change a node's own answer removed."""
    return PlacementRequest.model_validate(
        {**{f: getattr(request, f) for f in _SHAPE_FIELDS}, **_PER_REQUEST}
    )


def shape_key(request: PlacementRequest) -> tuple[object, ...]:
    return tuple(getattr(request, f) for f in _SHAPE_FIELDS)


# Per-slot fields, in the order _Row carries them after the fit flag.
_PER_SLOT = ("chosen", "ring", "pair", "quality", "fragmentation", "numa_span", "free_after")


@dataclass
class _ShapeCache:
    shape: PlacementRequest
    seen: int  # the cluster clock this cache is current with (-1: never)
    version: NDArray[np.int64]  # per slot: the slot version its entries were computed at
    words: list[NDArray[np.int64]]  # rank_words per slot; words[0] is _NONE where it does not fit
    chosen: NDArray[np.int64]
    ring: NDArray[np.float64]
    pair: NDArray[np.float64]
    quality: NDArray[np.float64]
    fragmentation: NDArray[np.float64]
    numa_span: NDArray[np.int64]
    free_after: NDArray[np.int64]
    # Best node first: (-word0, -word1, ..., slot, version). Entries whose
    # version is no longer the slot's are dropped lazily when they surface.
    heap: list[tuple[int, ...]] = field(default_factory=list)

    @classmethod
    def empty(cls, size: int, shape: PlacementRequest) -> _ShapeCache:
        return cls(
            shape=shape,
            seen=-1,
            version=np.full(size, -1, dtype=np.int64),
            words=[],
            chosen=np.zeros(size, dtype=np.int64),
            ring=np.zeros(size),
            pair=np.zeros(size),
            quality=np.zeros(size),
            fragmentation=np.zeros(size),
            numa_span=np.zeros(size, dtype=np.int64),
            free_after=np.zeros(size, dtype=np.int64),
        )

    def grow(self, size: int) -> None:
        def grown(old: NDArray[Any], fill: int) -> NDArray[Any]:
            new = np.full(size, fill, dtype=old.dtype)
            new[: old.size] = old
            return new

        self.version = grown(self.version, -1)
        self.words = [grown(w, _NONE if i == 0 else 0) for i, w in enumerate(self.words)]
        for name in _PER_SLOT:
            setattr(self, name, grown(getattr(self, name), 0))


class ShapeCaches:
    def __init__(self) -> None:
        self._caches: OrderedDict[tuple[object, ...], _ShapeCache] = OrderedDict()

    def get(self, request: PlacementRequest, size: int) -> _ShapeCache:
        key = shape_key(request)
        cache = self._caches.get(key)
        if cache is None:
            cache = _ShapeCache.empty(size, shape_of(request))
            self._caches[key] = cache
            if len(self._caches) > MAX_SHAPES:
                self._caches.popitem(last=False)
        else:
            self._caches.move_to_end(key)
            if cache.version.size < size:
                cache.grow(size)
        return cache


def _stale_slots(state: ClusterState, cache: _ShapeCache) -> NDArray[np.int64]:
    n = state.slot_count
    touched = state.touched_since(cache.seen)
    if touched is None:
        return np.flatnonzero(cache.version[:n] != state.slot_version[:n]).astype(np.int64)
    return np.asarray(touched, dtype=np.int64)


# One node's cached answer: fits, then _PER_SLOT's fields, then what the rank words need.
_Row = tuple[bool, int, float, float, float, float, int, int, bool]


def _refresh(state: ClusterState, cache: _ShapeCache) -> None:
    if cache.seen == state.clock:
        return
    stale = _stale_slots(state, cache)
    cache.seen = state.clock
    if not stale.size:
        return
    words: list[Any]  # per word, one value per stale slot (a list or an array)
    if stale.size <= SCALAR_LIMIT:
        rows = _rows_few(state, cache.shape, stale)
        columns = list(zip(*rows, strict=True))
        for name, column in zip(_PER_SLOT, columns[1:8], strict=True):
            getattr(cache, name)[stale] = column
        words = _words_few(rows, cache.shape)
    else:
        words = _store_many(state, cache, stale)
    if not cache.words:
        size = cache.version.size
        cache.words = [
            np.full(size, _NONE if i == 0 else 0, dtype=np.int64) for i in range(len(words))
        ]
    for i, stored in enumerate(cache.words):
        stored[stale] = words[i]
    cache.version[stale] = state.slot_version[stale]
    _push(cache, stale)


def _push(cache: _ShapeCache, stale: NDArray[np.int64]) -> None:
    """Keep the heap in step with the words; rebuilt when mostly stale entries remain.

    A few hundred changed nodes (a sweep that ended hundreds of reservations)
    are pushed one by one: rebuilding the heap of every node for them stalled
    the next decision for tens of milliseconds at 10,000 nodes.
    """
    size = cache.version.size
    if 4 * stale.size > size or len(cache.heap) > 4 * size + 64:
        live = np.flatnonzero(cache.words[0] != _NONE)
        columns = [(-w[live]).tolist() for w in cache.words]
        cache.heap = list(zip(*columns, live.tolist(), cache.version[live].tolist(), strict=True))
        heapq.heapify(cache.heap)
        return
    versions = cache.version[stale].tolist()
    for i, slot in enumerate(stale.tolist()):
        if cache.words[0][slot] != _NONE:
            entry = (*(-int(w[slot]) for w in cache.words), slot, versions[i])
            heapq.heappush(cache.heap, entry)


def _heap_best(cache: _ShapeCache) -> int | None:
    """The best slot, in O(log n): stale entries on top are popped and forgotten."""
    heap = cache.heap
    while heap:
        top = heap[0]
        slot, version = top[-2], top[-1]
        if cache.version[slot] == version and cache.words[0][slot] != _NONE:
            return slot
        heapq.heappop(heap)
    return None


def _store_many(
    state: ClusterState, cache: _ShapeCache, stale: NDArray[np.int64]
) -> list[NDArray[np.int64]]:
    """Many stale slots (a new shape, churn): the array path, stored; returns the rank words."""
    shape = cache.shape
    a = analyse(state, shape, shape.gpus, stale)
    for name in _PER_SLOT:
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
    words[0] = np.where(a.fits() & state.present[stale], words[0], _NONE)
    return words


def _words_few(rows: list[_Row], shape: PlacementRequest) -> list[list[int]]:
    per_slot = [
        pack_words(rank_columns(ring, pair, quality, frag, conn, free_after, False, shape))
        for _, _, ring, pair, quality, frag, _, free_after, conn in rows
    ]
    words = [list(column) for column in zip(*per_slot, strict=True)]
    words[0] = [w if row[0] else int(_NONE) for w, row in zip(words[0], rows, strict=True)]
    return words


def _rows_few(state: ClusterState, shape: PlacementRequest, slots: NDArray[np.int64]) -> list[_Row]:
    """``analyse`` for a handful of slots, one node at a time in plain Python.

    Same checks in the same order as ``analyse`` (a test holds the two paths
    to the same answers); it only tells fit from no fit, which is all the
    cache needs.
    """
    k = shape.gpus
    query = query_for(shape, k)
    reg = state.registry
    constrained = bool(shape.gpu_models) or shape.min_gpu_memory_mib > 0
    eligible = gpu_eligible(state, shape) if constrained else None
    rows: list[_Row] = []
    for slot in slots.tolist():
        cid = int(state.cid[slot])
        elig = -1 if eligible is None else int(eligible[slot])
        free_live = int(state.free[slot])
        potential = int(state.potential[slot]) & elig
        ideal = NO_SET if potential.bit_count() < k else reg.choose_one(cid, potential, query)
        fits = (
            ideal != NO_SET
            and bool(state.present[slot])
            and bool(state.available[slot])
            and (int(state.healthy[slot]) & elig).bit_count() >= k
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


def fast_place(state: ClusterState, request: PlacementRequest) -> TaskPlacement | None:
    """The best node's task for a single-task whole-GPU request, or None to use the full path."""
    cache = state.shape_caches.get(request, state.slot_count)
    _refresh(state, cache)
    n = state.slot_count
    if not n or not cache.words:
        return None
    filtered = request.regions or request.node_labels or request.exclude_nodes
    if request.nodes is None and not filtered:
        best = _heap_best(cache)
        return None if best is None else _task(state, cache, request, best)
    # Named candidates (a Slurm partition, an operator's list) or filters: the best of
    # the slots that pass, from the same cached words. Ascending slots, as the heap's
    # tie-break and the full path's.
    slots = requested_slots(state, request) if request.nodes is not None else None
    first = cache.words[0][:n] if slots is None else cache.words[0][slots]
    if request.regions:
        first = np.where(_at(region_ok(state, request.regions), n, slots), first, _NONE)
    if request.node_labels:
        first = np.where(_at(labels_ok(state, request.node_labels), n, slots), first, _NONE)
    if request.exclude_nodes and slots is None:  # requested_slots drops them from a list
        first = first.copy()
        for name in request.exclude_nodes:
            if name in state.entries:
                first[state.entries[name].slot] = _NONE
    if not first.size or (top := first.max()) == _NONE:
        return None
    tied = np.flatnonzero(first == top).astype(np.int64)
    if slots is not None:
        tied = slots[tied]
    return _task(state, cache, request, best_of(cache.words[1:], tied))


def _at(mask: NDArray[np.bool_], n: int, slots: NDArray[np.int64] | None) -> NDArray[np.bool_]:
    """A per-slot mask, over every slot or over the named ones."""
    return mask[:n] if slots is None else mask[slots]


def _task(
    state: ClusterState, cache: _ShapeCache, request: PlacementRequest, slot: int
) -> TaskPlacement | None:
    from placement.task_builder import build_task, score_parts

    parts = score_parts(cache, slot)
    return build_task(state, slot, int(cache.chosen[slot]), request, 0, parts)
