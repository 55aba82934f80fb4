"""Brute-force references the engine is checked against (deliberately naive)."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np


def ring_bruteforce(bw: np.ndarray, members: tuple[int, ...]) -> float:
    """Max over cyclic orders of the min consecutive bandwidth (all orders tried)."""
    k = len(members)
    if k < 2:
        return 0.0
    if k == 2:
        return float(bw[members[0], members[1]])
    if k <= 8:
        first, rest = members[0], members[1:]
        best = -1.0
        for perm in itertools.permutations(rest):
            cycle = (first, *perm)
            best = max(best, min(float(bw[cycle[i], cycle[(i + 1) % k]]) for i in range(k)))
        return best
    return _ring_by_thresholds(bw, members)


def _ring_by_thresholds(bw: np.ndarray, members: tuple[int, ...]) -> float:
    """For larger sets: the largest threshold whose graph has a Hamiltonian cycle (plain DFS)."""
    levels = sorted({float(bw[a, b]) for a in members for b in members if a != b}, reverse=True)
    for t in levels:
        if _hamiltonian(bw, members, t):
            return t
    return 0.0


def _hamiltonian(bw: np.ndarray, members: tuple[int, ...], t: float) -> bool:
    k = len(members)
    start = members[0]
    seen = {start}

    def dfs(v: int) -> bool:
        if len(seen) == k:
            return bool(bw[v, start] >= t)
        for u in members:
            if u not in seen and bw[v, u] >= t:
                seen.add(u)
                if dfs(u):
                    return True
                seen.remove(u)
        return False

    return dfs(start)


def pair_sum(bw: np.ndarray, members: tuple[int, ...]) -> float:
    return float(sum(bw[a, b] for a, b in itertools.combinations(members, 2)))


def nvlink_connected(nvlink: np.ndarray, members: tuple[int, ...]) -> bool:
    if not members:
        return False
    seen = {members[0]}
    stack = [members[0]]
    while stack:
        v = stack.pop()
        for u in members:
            if u not in seen and nvlink[v, u]:
                seen.add(u)
                stack.append(u)
    return len(seen) == len(members)


def best_value(
    bw: np.ndarray,
    nvlink: np.ndarray,
    numa: tuple[int, ...],
    free: tuple[int, ...],
    k: int,
    require_nvlink: bool = False,
    numa_required: bool = False,
) -> tuple[float, float] | None:
    """The optimum (ring, pair) over every k-subset of the free GPUs, or None."""
    best: tuple[float, float] | None = None
    for subset in itertools.combinations(free, k):
        if require_nvlink and not nvlink_connected(nvlink, subset):
            continue
        if numa_required and len({numa[i] for i in subset}) > 1:
            continue
        value = (ring_bruteforce(bw, subset), round(pair_sum(bw, subset), 6))
        if best is None or value > best:
            best = value
    return best


def large_best_set(tc: Any, free: int, query: Any) -> int:
    """The large-node search as first written, one seed and one candidate GPU at a time:
    grow a set greedily from every free GPU, keep the best by (ring, pair, pair left
    free, lowest mask). ``tc`` is a placement.large_node.LargeClass."""
    free_idx = [i for i in range(tc.n) if free >> i & 1]
    if query.k < 1 or len(free_idx) < query.k:
        return -1
    bw, nvlink, numa = tc.wiring.bw, tc.wiring.nvlink, tc.wiring.gpu_numa
    best: tuple[float, float, float, int] | None = None
    for seed in free_idx:
        chosen = [seed]
        while len(chosen) < query.k:
            pick: tuple[float, float, int] | None = None
            for v in free_idx:
                if v in chosen:
                    continue
                if query.numa_required and numa[v] != numa[seed]:
                    continue
                if query.require_nvlink and not any(nvlink[v, c] for c in chosen):
                    continue
                links = [float(bw[v, c]) for c in chosen]
                step = (min(links), sum(links), -v)
                if pick is None or step > pick:
                    pick = step
            if pick is None:
                break
            chosen.append(-pick[2])
        if len(chosen) < query.k:
            continue
        mask = sum(1 << i for i in chosen)
        members = tuple(sorted(chosen))
        if query.require_nvlink and not nvlink_connected(nvlink, members):
            continue
        if query.numa_required and len({numa[i] for i in members}) > 1:
            continue
        found = (_large_ring(bw, members), tc.pair(mask), tc.pair(free & ~mask), -mask)
        if best is None or found > best:
            best = found
    return -1 if best is None else -best[3]


def _large_ring(bw: np.ndarray, members: tuple[int, ...]) -> float:
    """The ring a large node reports: exact up to 12 GPUs, else a greedy tour's."""
    from placement.topology_class import _ring_bottlenecks

    k = len(members)
    sub = bw[np.ix_(members, members)]
    if k < 2:
        return 0.0
    if k == 2:
        return float(sub[0, 1])
    if k <= 12:
        masks = np.arange(1 << k, dtype=np.int64)
        popcount = np.array([bin(m).count("1") for m in range(1 << k)], dtype=np.int64)
        return float(_ring_bottlenecks(sub, masks, popcount)[-1])
    tour = [0]
    left = set(range(1, k))
    while left:
        last = tour[-1]
        nxt = max(left, key=lambda v: (sub[last, v], -v))
        tour.append(nxt)
        left.remove(nxt)
    return float(min(sub[tour[i], tour[(i + 1) % k]] for i in range(k)))
