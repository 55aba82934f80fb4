"""Ranking candidate nodes for one task: one ordering, stated once.

Order, best first (each key breaks the ties of the ones before it):

1. not inside a multi-node NVLink domain that a waiting gang needs;
2. ``locality=prefer``: NVLink-connected sets before the rest;
3. ``performance``: bandwidth quality, i.e. the set's ring relative to the
   best ring this node design can give for k GPUs (so an 8-GPU V100 box
   that can still give its best is not ranked below a busy H100 box that
   cannot); ``balanced``: only whether quality is within ``max_ring_loss``;
4. once a request has named GPU models: the least pressure on the node's
   models (``placement.model_demand``);
5. with host figures (``cpu_milli``, ``memory_mib``): the fewest GPUs
   stranded for want of host CPU or memory (``placement.host``), then the
   least expected fragmentation added under the task mix
   (``placement.task_mix``);
6. policy: ``pack`` takes the node left with the fewest free GPUs (best fit),
   ``spread`` the one left with the most;
7. ``balanced``: fragmentation, then quality;
8. ring, pair bandwidth, fragmentation (what the node can still serve), and
   finally the order nodes were added in, so equal inputs give equal answers.

All keys are arrays over the candidate nodes; one ``np.lexsort`` orders them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from placement.request import PlacementRequest

# Every key is compared as an integer: bandwidth at 1/64 GB/s, ratios at
# 2^-24 (quality) and 2^-20 (fragmentation). Float noise can then never
# split a tie, and keys pack into a few int64 words that both the full path
# (one lexsort) and the hot path (a max per word) read the same way.
QUALITY_STEPS = 1 << 24
FRAG_STEPS = 1 << 20
GBPS_STEPS = 64
_PACK_LIMIT = 1 << 7  # GPUs left free on one node: at most 64
_STRAND_ZERO = 1 << 7  # whole GPUs stranded by one choice, -64..64, kept non-negative
# Expected fragmentation added, in GPUs at 1/1024 (finer than the mix's thousandths of a
# GPU), within +-8192 GPUs: kept non-negative.
EXPECTED_STEPS = 1 << 10
_EXPECTED_ZERO = 1 << 23
# Model pressure 0..4 in whole quarters, rounded down: below a quarter a model's demand
# is a small part of its supply (measured: ranking by it then broke the NVLink sets that
# multi-GPU jobs need for no gain; docs/engine.md).
PRESSURE_STEPS = 4
_PRESSURE_TOP = 1 << 7
_WORD_BITS = 62


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
    stranded: NDArray[np.float64] | None = None  # whole GPUs stranded; None: not counted
    # Pressure on the node's GPU models (placement.model_demand); None: no request named one.
    pressure: NDArray[np.float64] | None = None
    # Expected fragmentation added, GPUs (placement.task_mix); None: not counted.
    expected: NDArray[np.float64] | None = None


def _q(values: Any, steps: int) -> Any:
    if isinstance(values, np.ndarray):
        return np.asarray(np.round(values * steps), dtype=np.int64)
    return round(values * steps)


def _int(flags: Any) -> Any:
    return flags.astype(np.int64) if isinstance(flags, np.ndarray) else int(flags)


def rank_columns(
    ring: Any,
    pair: Any,
    quality: Any,
    fragmentation: Any,
    connected: Any,
    free_after: Any,
    protected: Any,
    request: PlacementRequest,
    stranded: Any = None,
    pressure: Any = None,
    expected: Any = None,
) -> list[tuple[Any, int]]:
    """(key, bits) in order of importance, larger is better; insertion order breaks ties.

    Works on arrays (many nodes) and on plain numbers (one node): the hot
    path refreshes one or two nodes per decision, where numpy's per-call cost
    would dominate. ``stranded`` (GPUs the choice strands for want of host CPU
    or memory) is a key only for requests with host figures; without them
    the columns are exactly those of a GPU-only request.
    """
    quality_q = _q(quality, QUALITY_STEPS)
    pack = _PACK_LIMIT - 1 - free_after if request.policy == "pack" else free_after
    fragmentation_q = _q(fragmentation, FRAG_STEPS)
    columns: list[tuple[Any, int]] = [
        (1 - _int(protected), 1),
        (_int(connected) if request.locality == "prefer" else 0 * pack, 1),
    ]
    # GPUs stranded cost as GPUs lost to every later request: before packing, which
    # only chooses among the nodes that lose the fewest (docs/engine.md).
    host = [] if stranded is None else [(_STRAND_ZERO - _q(stranded, 1), 8)]
    # Among the nodes that strand as few whole GPUs, the one whose choice leaves the least
    # of its free capacity unusable by the task mix (FGD's gradient, host included): the
    # mean figures per GPU above miss a node whose CPU the mix's larger tasks need, and
    # packing alone cannot tell a node left usable from one left stranded
    # (docs/engine.md, "What the task mix can still use").
    if expected is not None:
        host.append((_EXPECTED_ZERO - _q(expected, EXPECTED_STEPS), 24))
    # Of equally good nodes, the one whose GPU models fewer requests insist on: what can
    # run anywhere leaves the pressed models to what cannot (placement.model_demand).
    # Before the host term and packing, which only choose among the least pressed.
    if pressure is not None:
        pressed = np.floor(np.asarray(pressure) * PRESSURE_STEPS).astype(np.int64)
        host = [(_PRESSURE_TOP - pressed, 8), *host]
    if request.objective == "balanced":
        floor = round((1.0 - request.max_ring_loss) * QUALITY_STEPS)
        columns += [
            (_int(quality_q >= floor), 1),
            *host,
            (pack, 8),
            (fragmentation_q, 21),
            (quality_q, 25),
        ]
    else:
        columns += [(quality_q, 25), *host, (pack, 8)]
    columns += [(_q(ring, GBPS_STEPS), 22), (_q(pair, GBPS_STEPS), 30), (fragmentation_q, 21)]
    return columns


def pack_words(columns: list[tuple[Any, int]]) -> list[Any]:
    """Columns packed greedily into int64 words (or ints), compared lexicographically."""
    words: list[Any] = []
    word: Any = None
    used = 0
    for values, bits in columns:
        if word is None or used + bits > _WORD_BITS:
            if word is not None:
                words.append(word)
            word, used = 0 * values, 0
        word = (word << bits) | values
        used += bits
    if word is not None:
        words.append(word)
    return words


def rank_words(inputs: RankInputs, request: PlacementRequest) -> list[NDArray[np.int64]]:
    """The ranking keys of every input node packed into int64 words."""
    columns = rank_columns(
        inputs.ring,
        inputs.pair,
        inputs.quality,
        inputs.fragmentation,
        inputs.connected,
        np.asarray(inputs.free_after, dtype=np.int64),
        inputs.protected,
        request,
        inputs.stranded if request.counts_host else None,
        inputs.pressure,
        inputs.expected if request.counts_host else None,
    )
    return [np.asarray(w, dtype=np.int64) for w in pack_words(columns)]


def rank_order(inputs: RankInputs, request: PlacementRequest) -> NDArray[np.int64]:
    """Indices into the inputs, best node first (a full sort: for scoring every node)."""
    words = rank_words(inputs, request)
    # lexsort is stable: among equal keys the input order (slot order) stays.
    return np.lexsort(tuple(-w for w in reversed(words))).astype(np.int64)


def best_of(words: list[NDArray[np.int64]], among: NDArray[np.int64]) -> int:
    """The best of ``among`` (ascending) without sorting: maxima word by word, then the first.

    The hot path needs one node, not an order: the first word usually leaves
    a handful of nodes, so this costs a few passes over the candidates.
    """
    idx = among
    for word in words:
        if idx.size == 1:
            break
        values = word[idx]
        idx = idx[values == values.max()]
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
