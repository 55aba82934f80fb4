"""Storage of the hot path's per-shape answers (``placement.fast_path`` fills and reads it).

A request's "shape" is what decides each node's answer on its own; per
shape, per node slot, the cache keeps the chosen set, its metrics and the
packed ranking words, stamped with the slot's version. It lives here, below
the table, so that the table can own it without importing the search.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import numpy as np
from numpy.typing import NDArray

from placement.request import PlacementRequest

MAX_SHAPES = 64
NONE = np.iinfo(np.int64).min  # words[0] of a slot that does not fit


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
# One C call for the whole key: the key is read on every decision.
_shape_values = attrgetter(*_SHAPE_FIELDS)


def shape_of(request: PlacementRequest) -> PlacementRequest:
    """The request with everything that does not change a node's own answer removed."""
    return PlacementRequest.model_validate(
        {**{f: getattr(request, f) for f in _SHAPE_FIELDS}, **_PER_REQUEST}
    )


def shape_key(request: PlacementRequest) -> tuple[object, ...]:
    key: tuple[object, ...] = _shape_values(request)
    return key


# Per-slot fields, in the order fast_path's rows carry them after the fit flag.
PER_SLOT = ("chosen", "ring", "pair", "quality", "fragmentation", "numa_span", "free_after")


@dataclass
class ShapeCache:
    shape: PlacementRequest
    seen: int  # the cluster clock this cache is current with (-1: never)
    version: NDArray[np.int64]  # per slot: the slot version its entries were computed at
    words: list[NDArray[np.int64]]  # rank_words per slot; words[0] is NONE where it does not fit
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
    def empty(cls, size: int, shape: PlacementRequest) -> ShapeCache:
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
        self.words = [grown(w, NONE if i == 0 else 0) for i, w in enumerate(self.words)]
        for name in PER_SLOT:
            setattr(self, name, grown(getattr(self, name), 0))


class ShapeCaches:
    def __init__(self) -> None:
        self._caches: OrderedDict[tuple[object, ...], ShapeCache] = OrderedDict()

    def get(self, request: PlacementRequest, size: int) -> ShapeCache:
        key = shape_key(request)
        cache = self._caches.get(key)
        if cache is None:
            cache = ShapeCache.empty(size, shape_of(request))
            self._caches[key] = cache
            if len(self._caches) > MAX_SHAPES:
                self._caches.popitem(last=False)
        else:
            self._caches.move_to_end(key)
            if cache.version.size < size:
                cache.grow(size)
        return cache
