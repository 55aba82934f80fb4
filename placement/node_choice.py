"""The exact best GPU set on one node, from its topology class and free mask.

Objective for a task of k GPUs (``performance``), in order:

1. the bottleneck of the best ring through the set (``ring``), highest first;
2. the total pairwise bandwidth (``pair``), highest first;
3. what the node can still serve afterwards (``capability`` of the GPUs left
   free: per size of the size mix, the best ring and pair sum still
   reachable; see ``placement.what_is_left``), then their retained pair
   bandwidth, highest first: this is what keeps islands, quads and NVLink
   pairs whole;
4. sockets touched (NUMA nodes, or the sockets read off the PCIe links),
   fewest first; then the sockets the GPUs left free span, fewest first
   (the job goes beside other work, whole sockets stay whole);
5. the lowest mask, so that equal inputs give equal answers.

Because ``by_k[k]`` is sorted by (1, 2), the first feasible entry is the
optimum of (1)+(2) and its ties are contiguous among the feasible entries.

``balanced`` widens step 1: any set whose ring is within ``max_ring_loss``
of the best feasible ring qualifies, and among those (3) decides first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placement.topology_class import Masks, TopologyClass


@dataclass(frozen=True, slots=True)
class SetQuery:
    """What a task needs from one node. Hashable: it keys the answer caches."""

    k: int
    require_nvlink: bool = False
    numa_required: bool = False
    balanced: bool = False
    max_ring_loss: float = 0.5


NO_SET = -1


def feasible_sets(tc: TopologyClass, free: int, query: SetQuery) -> Masks:
    """All k-subsets of ``free`` that meet the hard constraints, best (ring, pair) first."""
    if query.k < 1 or query.k > tc.n:
        return np.empty(0, dtype=np.int64)
    candidates = tc.by_k[query.k]
    ok = (candidates & ~np.int64(free)) == 0
    if query.require_nvlink:
        ok &= tc.nvlink_connected[candidates]
    if query.numa_required:
        ok &= tc.numa_span[candidates] <= 1
    chosen: Masks = candidates[ok]
    return chosen


def best_set(tc: TopologyClass, free: int, query: SetQuery) -> int:
    """The chosen k-subset of ``free`` as a bit mask, or NO_SET when none qualifies."""
    sets = feasible_sets(tc, free, query)
    if not sets.size:
        return NO_SET
    top = sets[0]
    if query.balanced:
        floor = tc.ring[top] * (1.0 - query.max_ring_loss)
        contenders = sets[tc.ring[sets] >= floor - 1e-9]
    else:
        tied = (tc.ring[sets] == tc.ring[top]) & (tc.pair[sets] == tc.pair[top])
        contenders = sets[tied]
    if contenders.size == 1:
        return int(contenders[0])
    # Narrow key by key instead of sorting: after the first key or two only a
    # few sets remain, so ties among all 12,870 8-subsets of a 16-GPU
    # NVSwitch node cost a few gathers, not a sort. Every key: larger wins.
    left = np.int64(free) & ~contenders
    for key in (
        lambda c, rest: tc.capability[rest],
        lambda c, rest: tc.pair[rest],
        lambda c, rest: tc.ring[c],
        lambda c, rest: tc.pair[c],
        lambda c, rest: -tc.socket_span[c],
        lambda c, rest: -tc.socket_span[rest],
    ):
        values = key(contenders, left)
        keep = values == values.max()
        contenders, left = contenders[keep], left[keep]
        if contenders.size == 1:
            break
    # Contenders keep their by_k order, ascending mask among equals.
    return int(contenders[0])


def mask_to_indices(mask: int) -> tuple[int, ...]:
    out = []
    i = 0
    while mask:
        if mask & 1:
            out.append(i)
        mask >>= 1
        i += 1
    return tuple(out)


def indices_to_mask(indices: tuple[int, ...] | list[int]) -> int:
    mask = 0
    for i in indices:
        mask |= 1 << i
    return mask
