"""Best-effort search for nodes with more GPUs than the exact tables cover.

Nodes above EXACT_LIMIT GPUs (rare: some 20- and 32-GPU designs) cannot
afford 2^n tables. For them the engine grows a set greedily from every free
GPU (next GPU: the one with the best bottleneck, then total bandwidth, to
the set so far), keeps the best result, and computes that set's ring
exactly when it has at most RING_EXACT_LIMIT GPUs, else by a greedy tour
(a lower bound). Every /place beside such a node searches it again once its
free GPUs changed, so the search is bounded in work: all seeds grow at once
as arrays, and rings (the costly key) are computed best upper bound first,
only while a set can still win: about 1-2 ms for 8 GPUs of 63, not 100-200.
The answer is valid and usually optimal for structured
wiring (NVSwitch, islands), but it is not proven optimal; the engine says
so in its docs. Fragmentation uses retained pair bandwidth only.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

from placement.node_choice import NO_SET, SetQuery
from placement.topology_class import Floats, Wiring

RING_EXACT_LIMIT = 12
# Answers kept per large design, (free GPUs, query) -> best set, least recently used
# going first. The search costs milliseconds on a 63-GPU node (an exact ring of 12 GPUs
# alone is 5 ms) and its answer depends only on the design, the free set and the query, so a
# kept answer is never stale: a node whose free set changes asks with another key. An
# entry is a few dozen bytes; the bound keeps a node churning through free sets small.
LARGE_ANSWERS = 4096


class LargeClass:
    def __init__(self, key: str, wiring: Wiring) -> None:
        self.key = key
        self.wiring = wiring
        self.n = wiring.n
        self.full_mask = (1 << self.n) - 1
        self._ring = lru_cache(maxsize=65536)(self._ring_uncached)
        # lru_cache, not a dict: readers may run concurrently (placement.cluster's
        # contract) and it stays bounded and consistent under them.
        self._best = lru_cache(maxsize=LARGE_ANSWERS)(self._best_set_uncached)
        self._full_pair = self.pair(self.full_mask)
        # Per GPU, its NVLink neighbours as a mask: connectivity by whole masks at a time.
        self._neighbours = [
            sum(1 << j for j in range(self.n) if wiring.nvlink[i, j]) for i in range(self.n)
        ]

    def members(self, mask: int) -> list[int]:
        return [i for i in range(self.n) if mask >> i & 1]

    def pair(self, mask: int) -> float:
        idx = self.members(mask)
        sub = self.wiring.bw[np.ix_(idx, idx)]
        return float(round(sub.sum() / 2.0, 6))

    def ring(self, mask: int) -> float:
        return float(self._ring(mask))

    def _ring_uncached(self, mask: int) -> float:
        idx = self.members(mask)
        k = len(idx)
        if k < 2:
            return 0.0
        sub = self.wiring.bw[np.ix_(idx, idx)]
        if k == 2:
            return float(sub[0, 1])
        tour = _greedy_tour_bottleneck(sub)
        if k > RING_EXACT_LIMIT:
            return tour
        # The exact search costs 2-11 ms a set; a tour as good as the ring's upper bound
        # (every GPU's second-best link within the set) is the best ring already.
        if tour == float(_second_best_bounds(sub[None])[0]):
            return tour
        return _ring_exact(sub)

    def connected(self, mask: int) -> bool:
        if not mask:
            return False
        reach = frontier = mask & -mask
        while frontier:
            grown = 0
            for v in self.members(frontier):
                grown |= self._neighbours[v]
            frontier = grown & mask & ~reach
            reach |= frontier
        return reach == mask

    def numa_span(self, mask: int) -> int:
        return len({self.wiring.gpu_numa[i] for i in self.members(mask)})

    def metrics(self, mask: int) -> tuple[float, float, bool, int]:
        return self.ring(mask), self.pair(mask), self.connected(mask), self.numa_span(mask)

    def capability(self, mask: int) -> float:
        return self.pair(mask) / self._full_pair if self._full_pair > 0 else 0.0

    def best_set(self, free: int, query: SetQuery) -> int:
        """The best set of ``query.k`` GPUs among ``free`` (NO_SET where none), kept."""
        answer: int = self._best(free, query)
        return answer

    @property
    def kept_answers(self) -> int:
        """How many (free set, query) answers are kept now (at most LARGE_ANSWERS)."""
        return self._best.cache_info().currsize

    def _best_set_uncached(self, free: int, query: SetQuery) -> int:
        free_idx = self.members(free)
        k = query.k
        if k < 1 or len(free_idx) < k:
            return NO_SET
        idx = np.asarray(free_idx, dtype=np.intp)
        grown = self._grown(idx, query)
        weights = np.left_shift(np.uint64(1), idx.astype(np.uint64))
        found, first = np.unique(grown.astype(np.uint64) @ weights, return_index=True)
        masks: list[int] = found.tolist()
        ok = [
            not (query.require_nvlink and not self.connected(mask))
            and not (query.numa_required and self.numa_span(mask) > 1)
            for mask in masks
        ]
        inside = grown[first][ok]
        masks = [mask for mask, good in zip(masks, ok, strict=True) if good]
        if not masks:
            return NO_SET
        # Every set's pair and pair left free at once. Rounded to 6 decimals as pair() is,
        # so a sum taken in another order gives the same figure (rates have at most a few
        # decimals; float noise is some 1e-10).
        links = self.wiring.bw[np.ix_(idx, idx)]
        pairs = _pair_sums(links, inside)
        lefts = _pair_sums(links, ~inside)
        bounds = self._ring_bounds(links, inside, masks)
        # Best by (ring, pair, pair left free, lowest mask). Only the ring is costly (an
        # exact search over subsets up to RING_EXACT_LIMIT GPUs, 2-11 ms a set) and every
        # other key is known, so sets are tried best (ring bound, pair, left, lowest mask)
        # first and the scan stops at the first whose bound is below the best key found:
        # no set after it can win. On uniform wiring one ring is computed, not one a seed.
        order = np.lexsort((found[ok], -lefts, -pairs, -bounds)).tolist()
        best: tuple[float, float, float, int] | None = None
        for at in order:
            if best is not None and (bounds[at], pairs[at], lefts[at], -masks[at]) < best:
                break
            key = (self.ring(masks[at]), float(pairs[at]), float(lefts[at]), -masks[at])
            if best is None or key > best:
                best = key
        assert best is not None
        return -best[3]

    def _grown(self, idx: NDArray[np.intp], query: SetQuery) -> NDArray[np.bool_]:
        """Per seed (each free GPU ``idx``), the set grown greedily from it, as a row over
        ``idx``; seeds with no allowed GPU left before k grow nothing and have no row.

        Each step adds, per seed, the allowed GPU with the best (bottleneck to the set,
        total bandwidth to the set, lowest index); the totals are summed in the order
        the set grew, so the picks are those of a one-seed-at-a-time loop, float for
        float. Cost: k steps of a few passes over a free x free array (63 x 63, all
        seeds at once) instead of k x free^2 Python steps per seed.
        """
        m = idx.size
        to_set = self.wiring.bw[np.ix_(idx, idx)].T  # to_set[c, v] = bw[v, c]
        chosen = np.eye(m, dtype=np.bool_)
        low = to_set.copy()  # low[seed, v]: v's weakest link to the seed's set
        total = to_set.copy()  # total[seed, v]: v's links to the set, summed in growth order
        allowed = np.ones((m, m), dtype=np.bool_)
        if query.numa_required:
            numa = np.asarray(self.wiring.gpu_numa)[idx]
            allowed &= numa[None, :] == numa[:, None]
        linked_to = self.wiring.nvlink[np.ix_(idx, idx)].T  # linked_to[c, v] = nvlink[v, c]
        reach = linked_to.copy()
        alive = np.ones(m, dtype=np.bool_)
        rows = np.arange(m)
        for _ in range(query.k - 1):
            open_ = allowed & ~chosen
            if query.require_nvlink:
                open_ &= reach
            alive &= open_.any(axis=1)
            if not alive.any():
                break
            # Every row steps, the dead ones too (their picks are dropped with them below):
            # cheaper than selecting the live rows at every step.
            tie = open_ & (low == np.where(open_, low, -np.inf).max(axis=1, keepdims=True))
            tie &= total == np.where(tie, total, -np.inf).max(axis=1, keepdims=True)
            picks = tie.argmax(axis=1)  # the first tied column: the lowest GPU
            chosen[rows, picks] = True
            step = to_set[picks]
            np.minimum(low, step, out=low)
            total += step
            if query.require_nvlink:
                reach |= linked_to[picks]
        grown: NDArray[np.bool_] = chosen[alive]
        return grown

    def _ring_bounds(self, links: Floats, inside: NDArray[np.bool_], masks: list[int]) -> Floats:
        """Per set (a row of ``inside`` over the free GPUs ``links`` is between), a value
        its ring cannot exceed: in a ring of 3 or more GPUs every GPU has two neighbours,
        so the weakest link is at most the second-best link of every member within the
        set. Exact (the ring itself) for 1 and 2 GPUs and above RING_EXACT_LIMIT."""
        k = masks[0].bit_count()
        if k < 3:
            return np.asarray([self.ring(mask) for mask in masks], dtype=np.float64)
        at = np.nonzero(inside)[1].reshape(len(masks), k)  # members, ascending, per row
        within = links[at[:, :, None], at[:, None, :]]
        if k > RING_EXACT_LIMIT:
            return _tour_bottlenecks(within)  # the ring itself at this size
        return _second_best_bounds(within)


def _second_best_bounds(within: Floats) -> Floats:
    """Per set of 3 or more GPUs (``within``: one k x k link matrix per set), the
    smallest over members of their second-best link to another member: a ring's weakest
    link is never above it, every member having two ring neighbours."""
    k = within.shape[-1]
    within = within.copy()
    within[:, np.arange(k), np.arange(k)] = -np.inf
    second: Floats = np.partition(within, -2, axis=-1)[:, :, -2].min(axis=-1)
    return second


def _ring_exact(sub: Floats) -> float:
    """The best ring through all k GPUs of ``sub`` (k x k links): the largest weakest link
    over every cyclic order, for one set.

    best[mask, v]: the largest weakest link of a path from GPU 0 through the GPUs of mask
    ending at v (-1: none). The table's search (``_ring_bottlenecks``) answers every
    subset and starts a path at each subset's lowest GPU; one set needs only the paths
    from its GPU 0, and a layer of masks extends to every next GPU at once: about k
    array steps instead of k^2 (0.3 ms instead of 2 ms for 8 GPUs).
    """
    k = sub.shape[0]
    layers = _layers_from_first(k)
    bits = np.left_shift(np.int64(1), np.arange(k, dtype=np.int64))
    best = np.full((1 << k, k), -1.0)
    best[1, 0] = np.inf
    for layer in layers[:-1]:
        # ends[s, u]: the best path of layer[s] ended at any v, then on to u
        ends = np.minimum(best[layer][:, :, None], sub[None, :, :]).max(axis=1)
        rows, nxt = np.nonzero((layer[:, None] & bits[None, :]) == 0)
        targets = layer[rows] | bits[nxt]  # each (target, u) once per layer
        best[targets, nxt] = np.maximum(best[targets, nxt], ends[rows, nxt])
    return float(np.minimum(best[-1], sub[:, 0]).max())


@lru_cache(maxsize=RING_EXACT_LIMIT + 1)
def _layers_from_first(k: int) -> list[NDArray[np.int64]]:
    """The masks of k GPUs that hold GPU 0, by size (1..k): the paths ``_ring_exact`` grows."""
    masks = np.arange(1, 1 << k, 2, dtype=np.int64)
    sizes = np.array([bin(m).count("1") for m in masks.tolist()], dtype=np.int64)
    return [masks[sizes == p] for p in range(1, k + 1)]


def _pair_sums(links: Floats, rows: NDArray[np.bool_]) -> Floats:
    """Per row (GPUs over ``links``' axes), the sum of its pairwise links, as pair() gives it."""
    weight = rows.astype(np.float64)
    sums: Floats = np.round(((weight @ links) * weight).sum(axis=1) / 2.0, 6)
    return sums


def _greedy_tour_bottleneck(sub: Floats) -> float:
    """Bottleneck of a nearest-best-neighbour tour: a lower bound on the best ring."""
    return float(_tour_bottlenecks(sub[None])[0])


def _tour_bottlenecks(within: Floats) -> Floats:
    """Per set (``within``: one k x k link matrix per set), the weakest link of the tour
    that starts at its first GPU and goes on to the best-linked GPU not yet visited
    (the lowest on a tie), closing back to the start; every set at once."""
    count, k = within.shape[0], within.shape[1]
    rows = np.arange(count)
    left = np.ones((count, k), dtype=np.bool_)
    left[:, 0] = False
    last = np.zeros(count, dtype=np.intp)
    weakest = np.full(count, np.inf)
    for _ in range(k - 1):
        links = np.where(left, within[rows, last], -np.inf)
        nxt = links.argmax(axis=1)
        np.minimum(weakest, links[rows, nxt], out=weakest)
        left[rows, nxt] = False
        last = nxt
    closing: Floats = np.minimum(weakest, within[rows, last, 0])
    return closing
