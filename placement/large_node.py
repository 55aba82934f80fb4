"""Best-effort search for nodes with more GPUs than the exact tables cover.

Nodes above EXACT_LIMIT GPUs (rare: some 20- and 32-GPU designs) cannot
afford 2^n tables. For them the engine grows a set greedily from every free
GPU (next GPU: the one with the best bottleneck, then total bandwidth, to
the set so far), keeps the best result, and computes that set's ring
exactly when it has at most RING_EXACT_LIMIT GPUs, else by a greedy tour
(a lower bound). The answer is valid and usually optimal for structured
wiring (NVSwitch, islands), but it is not proven optimal; the engine says
so in its docs. Fragmentation uses retained pair bandwidth only.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from placement.node_choice import NO_SET, SetQuery
from placement.topology_class import Wiring, _ring_bottlenecks

RING_EXACT_LIMIT = 12
# Answers kept per large design, (free GPUs, query) -> best set, least recently used
# going first. The search costs tens of milliseconds on a 63-GPU node (62-71 ms for a
# /score) and its answer depends only on the design, the free set and the query, so a
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
        if k <= RING_EXACT_LIMIT:
            masks = np.arange(1 << k, dtype=np.int64)
            popcount = np.array([bin(m).count("1") for m in range(1 << k)], dtype=np.int64)
            return float(_ring_bottlenecks(sub, masks, popcount)[-1])
        return _greedy_tour_bottleneck(sub)

    def connected(self, mask: int) -> bool:
        idx = self.members(mask)
        if not idx:
            return False
        seen = {idx[0]}
        stack = [idx[0]]
        while stack:
            v = stack.pop()
            for u in idx:
                if u not in seen and self.wiring.nvlink[v, u]:
                    seen.add(u)
                    stack.append(u)
        return len(seen) == len(idx)

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
        if query.k < 1 or len(free_idx) < query.k:
            return NO_SET
        best: tuple[float, float, float, int] | None = None
        for seed in free_idx:
            mask = self._grow(seed, free_idx, query)
            if mask == NO_SET:
                continue
            ring, pair, connected, span = self.metrics(mask)
            if query.require_nvlink and not connected:
                continue
            if query.numa_required and span > 1:
                continue
            key = (ring, pair, self.pair(free & ~mask), -mask)
            if best is None or key > best:
                best = key
        return NO_SET if best is None else -best[3]

    def _grow(self, seed: int, free_idx: list[int], query: SetQuery) -> int:
        bw = self.wiring.bw
        chosen = [seed]
        while len(chosen) < query.k:
            pick: tuple[float, float, int] | None = None
            for v in free_idx:
                if v in chosen:
                    continue
                if query.numa_required and self.wiring.gpu_numa[v] != self.wiring.gpu_numa[seed]:
                    continue
                if query.require_nvlink and not any(self.wiring.nvlink[v, c] for c in chosen):
                    continue
                links = [float(bw[v, c]) for c in chosen]
                key = (min(links), sum(links), -v)
                if pick is None or key > pick:
                    pick = key
            if pick is None:
                return NO_SET
            chosen.append(-pick[2])
        return sum(1 << i for i in chosen)


def _greedy_tour_bottleneck(sub: np.ndarray) -> float:
    """Bottleneck of a nearest-best-neighbour tour: a lower bound on the best ring."""
    k = sub.shape[0]
    tour = [0]
    left = set(range(1, k))
    while left:
        last = tour[-1]
        nxt = max(left, key=lambda v: (sub[last, v], -v))
        tour.append(nxt)
        left.remove(nxt)
    return float(min(sub[tour[i], tour[(i + 1) % k]] for i in range(k)))
