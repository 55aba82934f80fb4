"""What the GPUs left free can still serve: the engine's fragmentation objective.

Among GPU sets that are equally good for the job in hand (same ring and
pair bandwidth), the engine leaves the node able to serve the requests most
likely to come next at their best bandwidth. Two published ideas combined:

- FGD (Weng et al., ATC '23): fragmentation is measured against the
  distribution of job sizes the cluster actually sees, not against one
  size; a size nobody asks for does not count.
- HiveD (Zhao et al., OSDI '20): keep the largest cells whole; among
  otherwise equal choices, the one that keeps a bigger set intact wins.

For a free set F and every size k = 1..n the node's *service* of k is

    s_k(F) = max over k-subsets S of F of  (ring(S) / ideal_ring[k]
                                            + pair(S) / ideal_pair[k]) / 2

where ideal_* are the ring and pair sum of the node's best k-set with
every GPU free (for k = 1 there is no ring: s_1 = 1 when any GPU is free).
A free set that still holds a best-ring-and-pair k-set scores 1 for k;
one whose best k-set rings at half the ideal over half the pair bandwidth
scores 0.5. The capability of F is sum_k w_k * s_k(F) with the weights of
the size mix (``size_weights``): the expected share of the next request's
best bandwidth the node can still give. Both ring *and* pair count, so a
4-set that rings at 25 GB/s over a full quad of NV2 links beats one that
rings the same over NV1 links (the DGX-1 case), and a 3-GPU ring counts
only as much as 3-GPU jobs are asked for.

Cost: one sum-over-subsets max sweep per size with a weight (n passes over
the 2^n masks each), the same order as the ring tables.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray

Floats = NDArray[np.float64]

# GPUs per whole-GPU pod in the Alibaba GPU trace 2023 (openb, default pod
# list): 3,911 one-GPU, 16 two-GPU, 15 four-GPU and 44 eight-GPU pods. The
# typical production mix: most requests are one GPU, and the few large ones
# are the ones fragmentation hurts.
DEFAULT_SIZE_MIX: Mapping[int, float] = {1: 3911.0, 2: 16.0, 4: 15.0, 8: 44.0}

# Every size gets at least this share of the weight (in all: small enough that it
# only breaks ties between sizes the mix does ask for), growing with the size
# (HiveD's rule: among otherwise equal choices keep the larger set whole),
# so sizes the mix never saw still break ties instead of counting nothing.
FLOOR = 0.001


def size_weights(mix: Mapping[int, float], n: int) -> Floats:
    """Weight per size 0..n (index = GPUs), summing to 1 over 1..n.

    Sizes above n fold into n (a request for more GPUs than the node has
    wants the whole node). Raises ValueError on negative or all-zero mixes.
    """
    if any(w < 0 for w in mix.values()) or any(k < 1 for k in mix):
        raise ValueError("a size mix maps sizes >= 1 to weights >= 0")
    observed = np.zeros(n + 1)
    for k, w in mix.items():
        observed[min(k, n)] += w
    total = observed.sum()
    if total <= 0:
        raise ValueError("a size mix needs at least one positive weight")
    sizes = np.arange(n + 1, dtype=np.float64)
    floor = sizes / sizes.sum() if n else sizes
    weights = (1.0 - FLOOR) * observed / total + FLOOR * floor
    weights[0] = 0.0
    return np.asarray(weights / weights.sum(), dtype=np.float64)


def capability(
    ring: Floats,
    pair: Floats,
    popcount: NDArray[np.int64],
    n: int,
    ideal_ring: tuple[float, ...],
    ideal_pair: tuple[float, ...],
    weights: Floats,
) -> Floats:
    """capability[mask] = sum_k weights[k] * s_k(mask), for every subset mask."""
    size = ring.size
    all_masks = np.arange(size, dtype=np.int64)
    with_bit = [np.flatnonzero((all_masks >> bit) & 1) for bit in range(n)]
    total = np.zeros(size, dtype=np.float64)
    for k in range(1, n + 1):
        if weights[k] <= 0:
            continue
        if k == 1:
            total += weights[1] * (popcount >= 1)
            continue
        ring_part = ring / ideal_ring[k] if ideal_ring[k] > 0 else np.ones(size)
        pair_part = np.minimum(pair / ideal_pair[k], 1.0) if ideal_pair[k] > 0 else np.ones(size)
        best = np.where(popcount == k, 0.5 * (ring_part + pair_part), 0.0)
        for bit in range(n):
            holders = with_bit[bit]
            best[holders] = np.maximum(best[holders], best[holders ^ (1 << bit)])
        total += weights[k] * best
    return np.round(total, 9)
