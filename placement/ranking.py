"""Ranking candidate nodes for one task: one ordering, stated once.

Order, best first (each key breaks the ties of the ones before it):

1. not inside a multi-node NVLink domain that a waiting gang needs;
2. ``locality=prefer``: NVLink-connected sets before the rest;
3. ``performance``: bandwidth quality, i.e. the set's ring relative to the
   best ring this node design can give for k GPUs (so an 8-GPU V100 box
   that can still give its best is not ranked below a busy H100 box that
   cannot); ``balanced``: only whether quality is within ``max_ring_loss``;
4. policy: ``pack`` takes the node left with the fewest free GPUs (best fit),
   ``spread`` the one left with the most;
5. ``balanced``: fragmentation, then quality;
6. ring, pair bandwidth, fragmentation (what the node can still serve), and
   finally the node name, so equal inputs give equal answers.

All keys are arrays over the candidate nodes; one ``np.lexsort`` orders them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from placement.request import PlacementRequest

_QUANTUM = 1e-9  # quality ratios equal up to float noise rank equal


@dataclass(frozen=True, slots=True)
class RankInputs:
    ring: NDArray[np.float64]
    pair: NDArray[np.float64]
    quality: NDArray[np.float64]  # 0..1
    fragmentation: NDArray[np.float64]  # 0..1, 1 = the choice costs nothing
    connected: NDArray[np.bool_]
    free_after: NDArray[np.int64]
    gpu_count: NDArray[np.int64]
    protected: NDArray[np.bool_]
    name_rank: NDArray[np.int64]


KeyFn = Callable[[NDArray[np.int64]], NDArray[np.generic]]


def rank_keys(inputs: RankInputs, request: PlacementRequest) -> list[KeyFn]:
    """The ordering keys, most important first, as functions of candidate indices.

    Smaller is better for every key. They are functions so that the hot
    path evaluates each key only on the candidates still tied before it.
    """
    quantum = _QUANTUM
    loss_floor = (1.0 - request.max_ring_loss) - _QUANTUM

    def quantized(i: NDArray[np.int64]) -> NDArray[np.float64]:
        return np.asarray(np.round(inputs.quality[i] / quantum) * quantum, dtype=np.float64)

    def quality(i: NDArray[np.int64]) -> NDArray[np.generic]:
        return -quantized(i)

    def pack(i: NDArray[np.int64]) -> NDArray[np.generic]:
        free_after = inputs.free_after[i]
        return free_after if request.policy == "pack" else -free_after

    keys: list[KeyFn] = [lambda i: inputs.protected[i].astype(np.int8)]
    if request.locality == "prefer":
        keys.append(lambda i: -inputs.connected[i].astype(np.int8))
    if request.objective == "balanced":
        keys += [
            lambda i: -(quantized(i) >= loss_floor).astype(np.int8),
            pack,
            lambda i: -inputs.fragmentation[i],
            quality,
        ]
    else:
        keys += [quality, pack]
    keys += [
        lambda i: -inputs.ring[i],
        lambda i: -inputs.pair[i],
        lambda i: -inputs.fragmentation[i],
        lambda i: inputs.name_rank[i],
    ]
    return keys


def leading_keys(request: PlacementRequest) -> int:
    """How many of ``rank_keys`` come before ring: the ones the hot path packs into one int."""
    return 1 + (request.locality == "prefer") + 2


def rank_order(inputs: RankInputs, request: PlacementRequest) -> NDArray[np.int64]:
    """Indices into the inputs, best node first (a full sort: for scoring every node)."""
    everyone = np.arange(inputs.ring.size, dtype=np.int64)
    columns = [key(everyone) for key in rank_keys(inputs, request)]
    return np.lexsort(tuple(reversed(columns))).astype(np.int64)


def best_index(keys: list[KeyFn], among: NDArray[np.int64]) -> int:
    """The best of ``among`` without sorting everything: narrow key by key.

    The hot path of /place needs one node, not an order: each key keeps only
    the entries at its minimum, so after the first key or two a handful are
    left. Cost O(n) for the first key instead of O(n log n) x keys.
    """
    idx = among
    for key in keys:
        if idx.size == 1:
            break
        values = key(idx)
        idx = idx[values == values.min()]
    return int(idx[0])


def scores(inputs: RankInputs, request: PlacementRequest) -> NDArray[np.float64]:
    """A 0..100 summary per node (bandwidth 60, packing 25, fragmentation 15).

    Schedulers that add their own scores (kube-scheduler's prioritize) get a
    number that moves the way the ranking does; the rank itself is what the
    engine acts on.
    """
    total = np.maximum(inputs.gpu_count, 1).astype(np.float64)
    fill = 1.0 - inputs.free_after / total
    pack_term = fill if request.policy == "pack" else 1.0 - fill
    return np.round(60.0 * inputs.quality + 25.0 * pack_term + 15.0 * inputs.fragmentation, 3)
