"""The /place hot path: per-node answers cached per request shape, per slot.

A request's "shape" is what decides each node's answer on its own (GPUs per
task, locality, NUMA rule, objective, policy, GPU model and memory). For
each shape we keep, per node slot, the chosen set, its metrics and a primary
ranking key, stamped with the slot's version. A decision then recomputes
only the slots whose version moved since the last decision of that shape
(usually the one or two nodes the previous decision and release touched),
and ranks 10,000 nodes with one max over the primary key plus a narrowing
among the few nodes tied on it. Filters that do not change a node's answer
(regions, labels, excluded nodes) are applied at selection time.

What it costs: ~70 bytes per slot per shape, at most MAX_SHAPES shapes (the
oldest is dropped). What it does not do: gangs, MIG, explicit node lists,
waiting-gang protection and failures fall back to the full path in
``decide``, which also produces the grouped reasons. Both paths share
``analyse`` and ``rank_keys``, so they agree (a test checks it).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from placement.analysis import FITS, Analysis, analyse, query_for
from placement.eligibility import gpu_eligible, labels_ok, region_ok
from placement.node_choice import NO_SET
from placement.outcome import ScoreParts
from placement.ranking import RankInputs, best_index, leading_keys, rank_keys
from placement.request import PlacementRequest

if TYPE_CHECKING:
    from placement.cluster import ClusterState
    from placement.outcome import TaskPlacement

MAX_SHAPES = 64
_NONE = np.iinfo(np.int64).min
_QUALITY_STEPS = 1 << 28  # quality ratios are compared at this resolution
_PACK_BITS = 20


def shape_of(request: PlacementRequest) -> PlacementRequest:
    """The request with everything that does not change a node's own answer removed."""
    return request.model_copy(
        update={
            "regions": (),
            "node_labels": {},
            "nodes": None,
            "exclude_nodes": (),
            "job_id": None,
            "priority": 0,
            "cpus_per_task": 0,
            "tasks": 1,
        }
    )


def _shape_key(request: PlacementRequest) -> tuple[object, ...]:
    return (
        request.gpus,
        request.locality,
        request.objective,
        request.max_ring_loss,
        request.numa,
        request.gpu_models,
        request.min_gpu_memory_mib,
        request.policy,
    )


@dataclass
class _ShapeCache:
    shape: PlacementRequest
    seen: int  # the cluster clock this cache is current with (-1: never)
    version: NDArray[np.int64]
    chosen: NDArray[np.int64]
    primary: NDArray[np.int64]
    ring: NDArray[np.float64]
    pair: NDArray[np.float64]
    quality: NDArray[np.float64]
    fragmentation: NDArray[np.float64]
    connected: NDArray[np.bool_]
    numa_span: NDArray[np.int64]
    free_after: NDArray[np.int64]
    gpu_count: NDArray[np.int64]
    protected: NDArray[np.bool_]  # always False: protection takes the full path

    @classmethod
    def empty(cls, size: int, shape: PlacementRequest) -> _ShapeCache:
        return cls(
            shape=shape,
            seen=-1,
            version=np.full(size, -1, dtype=np.int64),
            chosen=np.full(size, -1, dtype=np.int64),
            primary=np.full(size, _NONE, dtype=np.int64),
            ring=np.zeros(size),
            pair=np.zeros(size),
            quality=np.zeros(size),
            fragmentation=np.zeros(size),
            connected=np.zeros(size, dtype=np.bool_),
            numa_span=np.zeros(size, dtype=np.int64),
            free_after=np.zeros(size, dtype=np.int64),
            gpu_count=np.zeros(size, dtype=np.int64),
            protected=np.zeros(size, dtype=np.bool_),
        )

    def grow(self, size: int) -> None:
        for name, old in vars(self).items():
            if isinstance(old, np.ndarray) and old.size < size:
                fill = -1 if name in ("version", "chosen") else (_NONE if name == "primary" else 0)
                new = np.full(size, fill, dtype=old.dtype)
                new[: old.size] = old
                setattr(self, name, new)


class ShapeCaches:
    def __init__(self) -> None:
        self._caches: OrderedDict[tuple[object, ...], _ShapeCache] = OrderedDict()

    def get(self, request: PlacementRequest, size: int) -> _ShapeCache:
        key = _shape_key(request)
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


def _primary(
    request: PlacementRequest, fits: bool, quality: float, free_after: int, connected: bool
) -> int:
    """The leading ranking keys of ``rank_keys`` packed into one int (larger is better)."""
    if not fits:
        return int(_NONE)
    pack = (1 << _PACK_BITS) - 1 - free_after if request.policy == "pack" else free_after
    conn = int(connected) if request.locality == "prefer" else 0
    if request.objective == "balanced":
        within = quality >= (1.0 - request.max_ring_loss) - 1e-9
        return (conn << 62) | (int(within) << 61) | pack
    return (conn << 62) | (round(quality * _QUALITY_STEPS) << _PACK_BITS) | pack


SCALAR_LIMIT = 8  # below this many stale slots, per-node Python beats numpy's call overhead


def _refresh(state: ClusterState, cache: _ShapeCache, shape: PlacementRequest) -> None:
    if cache.seen == state.clock:
        return
    n = state.slot_count
    touched = state.touched_since(cache.seen)
    if touched is None:
        stale = np.flatnonzero(cache.version[:n] != state.slot_version[:n]).astype(np.int64)
    else:
        stale = np.asarray(touched, dtype=np.int64)
    cache.seen = state.clock
    if not stale.size:
        return
    if stale.size <= SCALAR_LIMIT:
        a = _analyse_few(state, shape, stale)
    else:
        a = analyse(state, shape, shape.gpus, stale)
    cache.version[stale] = state.slot_version[stale]
    cache.chosen[stale] = a.chosen
    fits = a.fits() & state.present[stale]
    cache.primary[stale] = [
        _primary(shape, ok, q, f, c)
        for ok, q, f, c in zip(
            fits.tolist(),
            a.quality.tolist(),
            a.free_after.tolist(),
            a.connected.tolist(),
            strict=True,
        )
    ]
    cache.ring[stale] = a.ring
    cache.pair[stale] = a.pair
    cache.quality[stale] = a.quality
    cache.fragmentation[stale] = a.fragmentation
    cache.connected[stale] = a.connected
    cache.numa_span[stale] = a.numa_span
    cache.free_after[stale] = a.free_after
    cache.gpu_count[stale] = a.gpu_count


def _analyse_few(
    state: ClusterState, shape: PlacementRequest, slots: NDArray[np.int64]
) -> Analysis:
    """``analyse`` for a handful of slots, one node at a time in plain Python.

    Same checks in the same order as ``analyse`` (a test holds them to the
    same answers); it only reports fit or no fit, which is all the cache needs.
    """
    k = shape.gpus
    query = query_for(shape, k)
    reg = state.registry
    constrained = bool(shape.gpu_models) or shape.min_gpu_memory_mib > 0
    eligible = gpu_eligible(state, shape) if constrained else None
    rows: list[tuple[int, float, float, bool, int, float, float, int, int]] = []
    for slot in slots.tolist():
        cid = int(state.cid[slot])
        elig = -1 if eligible is None else int(eligible[slot])
        free_live = int(state.free[slot])
        potential = int(state.potential[slot]) & elig
        answer = (NO_SET, 0.0, 0.0, False, 0, 0.0, 0.0, 0, 0)
        ideal = NO_SET if potential.bit_count() < k else reg.choose_one(cid, potential, query)
        fits = (
            ideal != NO_SET
            and bool(state.available[slot])
            and (int(state.healthy[slot]) & elig).bit_count() >= k
            and (free_live & elig).bit_count() >= k
        )
        chosen = reg.choose_one(cid, free_live & elig, query) if fits else NO_SET
        if chosen != NO_SET:
            ring, pair, connected, span = reg.set_metrics(cid, chosen)
            ideal_ring = reg.set_metrics(cid, ideal)[0]
            before = reg.capability_of(cid, free_live)
            after = reg.capability_of(cid, free_live & ~chosen)
            answer = (
                chosen,
                ring,
                pair,
                connected,
                span,
                min(ring / ideal_ring, 1.0) if ideal_ring > 0 else 1.0,
                min(max(after / before, 0.0), 1.0) if before > 0 else 1.0,
                free_live.bit_count() - k,
                int(state.potential[slot]).bit_count(),
            )
        rows.append(answer)
    columns = list(zip(*rows, strict=True))
    chosen_col = np.asarray(columns[0], dtype=np.int64)
    return Analysis(
        slots=slots,
        cause=np.where(chosen_col == NO_SET, 0, FITS).astype(np.int64),
        chosen=chosen_col,
        ring=np.asarray(columns[1], dtype=np.float64),
        pair=np.asarray(columns[2], dtype=np.float64),
        connected=np.asarray(columns[3], dtype=np.bool_),
        numa_span=np.asarray(columns[4], dtype=np.int64),
        quality=np.asarray(columns[5], dtype=np.float64),
        fragmentation=np.asarray(columns[6], dtype=np.float64),
        free_after=np.asarray(columns[7], dtype=np.int64),
        gpu_count=np.asarray(columns[8], dtype=np.int64),
    )


def fast_place(state: ClusterState, request: PlacementRequest) -> TaskPlacement | None:
    """The best node's task for a single-task whole-GPU request, or None to use the full path."""
    from placement.task_builder import build_task

    cache = state.shape_caches.get(request, state.slot_count)
    _refresh(state, cache, cache.shape)
    n = state.slot_count
    primary = cache.primary[:n]
    if request.regions:
        primary = np.where(region_ok(state, request.regions)[:n], primary, _NONE)
    if request.node_labels:
        primary = np.where(labels_ok(state, request.node_labels)[:n], primary, _NONE)
    if request.exclude_nodes:
        primary = primary.copy()
        for name in request.exclude_nodes:
            if name in state.entries:
                primary[state.entries[name].slot] = _NONE
    top = primary.max() if n else _NONE
    if top == _NONE:
        return None
    tied = np.flatnonzero(primary == top).astype(np.int64)
    if tied.size > 1:
        # Keys index the cache arrays by slot: nothing is gathered for keys
        # that the first one or two already decide.
        inputs = RankInputs(
            ring=cache.ring,
            pair=cache.pair,
            quality=cache.quality,
            fragmentation=cache.fragmentation,
            connected=cache.connected,
            free_after=cache.free_after,
            gpu_count=cache.gpu_count,
            protected=cache.protected,
            name_rank=state.name_rank,
        )
        keys = rank_keys(inputs, request)[leading_keys(request) :]
        slot = best_index(keys, tied)
    else:
        slot = int(tied[0])
    parts = ScoreParts(
        ring_gbps=float(cache.ring[slot]),
        pair_sum_gbps=float(cache.pair[slot]),
        bandwidth=round(float(cache.quality[slot]), 6),
        fragmentation=round(float(cache.fragmentation[slot]), 6),
        numa_nodes=int(cache.numa_span[slot]),
        free_after=int(cache.free_after[slot]),
    )
    return build_task(state, slot, int(cache.chosen[slot]), request, 0, parts)
