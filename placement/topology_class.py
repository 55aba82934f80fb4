"""Everything about a node's wiring that does not depend on what is free.

Nodes with the same wiring (same bandwidth matrix, same NVLink graph, same
GPU-to-NUMA map) share one ``TopologyClass``; a 10,000-node cluster built
from a handful of server designs has a handful of classes. For a class of
n <= EXACT_LIMIT GPUs we precompute, for every one of the 2^n GPU subsets:

- ``ring``: the bottleneck of the best ring through the subset (max over
  cyclic orders of the min consecutive pair bandwidth), by a Held-Karp style
  dynamic program over subsets that carries the best bottleneck of a
  Hamiltonian path from the subset's lowest GPU to each end;
- ``pair``: the sum of pairwise bandwidths;
- ``nvlink_connected``: whether the subset's own NVLink links connect it;
- ``numa_span``: how many NUMA nodes it touches;
- ``socket_span``: how many sockets it touches (the NUMA nodes where the
  snapshot names them, else the sockets read off the PCIe links);
- ``capability``: how well the subset, if it were the free set, could serve
  the next requests (``placement.what_is_left``): per size k, the best ring
  and pair sum reachable with k of its GPUs relative to the node's best,
  weighted by the size mix.

and, per size k, all k-subsets sorted best first by (ring, pair). The exact
search in ``node_choice`` is then a vectorised scan of one sorted list.

Cost: for 16 GPUs the tables take ~2 MB and ~0.2 s once per class; the
per-decision scan touches at most C(16, 8) = 12,870 entries. Nodes with more
than EXACT_LIMIT GPUs use the greedy search in ``large_node`` instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from placement.bandwidth import BandwidthTable, bandwidth_matrix, nvlink_adjacency
from placement.snapshot import NodeSnapshot
from placement.what_is_left import DEFAULT_SIZE_MIX, capability, size_weights

EXACT_LIMIT = 16

Masks = NDArray[np.int64]
Floats = NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Wiring:
    """The free-state-independent facts about a node's GPUs that placement reads."""

    bw: Floats  # n x n GB/s
    nvlink: NDArray[np.bool_]  # n x n
    gpu_numa: tuple[int, ...]  # -1 where unknown
    # Socket per GPU for tie-breaking only (NUMA rules read gpu_numa): the
    # NUMA node where known, else read off the PCIe links; () = gpu_numa.
    gpu_socket: tuple[int, ...] = ()

    @property
    def n(self) -> int:
        return int(self.bw.shape[0])

    def key(self) -> str:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(self.bw, dtype=np.float64).tobytes())
        digest.update(np.ascontiguousarray(self.nvlink).tobytes())
        digest.update(repr(self.gpu_numa).encode())
        digest.update(repr(self.sockets).encode())
        return f"{self.n}:{digest.hexdigest()[:24]}"

    @property
    def sockets(self) -> tuple[int, ...]:
        return self.gpu_socket or self.gpu_numa


def wiring_of(snapshot: NodeSnapshot, table: BandwidthTable) -> Wiring:
    numa = tuple(-1 if g.numa_node is None else g.numa_node for g in snapshot.gpus)
    return Wiring(
        bw=bandwidth_matrix(snapshot, table),
        nvlink=nvlink_adjacency(snapshot),
        gpu_numa=numa,
        gpu_socket=numa if _numa_agrees(snapshot, numa) else pcie_sockets(snapshot),
    )


def _numa_agrees(snapshot: NodeSnapshot, numa: tuple[int, ...]) -> bool:
    """Every GPU has a NUMA node, and no two on one node reach each other over ``SYS``.

    ``SYS`` crosses the link between sockets, so a NUMA node holding a ``SYS``
    pair is not a socket: e.g. a DGX-1 whose text prints one CPU Affinity for
    all eight GPUs (read as one NUMA node) still has two sockets on its links.
    """
    if -1 in numa:
        return False
    n = snapshot.gpu_count
    return not any(
        numa[i] == numa[j] and snapshot.link(i, j).label == "SYS"
        for i in range(n)
        for j in range(i + 1, n)
    )


def pcie_sockets(snapshot: NodeSnapshot) -> tuple[int, ...]:
    """Socket per GPU read off ``nvidia-smi topo -m`` labels, for nodes without NUMA data.

    Two GPUs share a socket when their link is a PCIe level short of
    ``SYS``, or when it is NVLink (which hides the PCIe path) and they have
    a third GPU that neither reaches over ``SYS`` (on a DGX-1, GPUs 0 and 4
    are NVLink partners on different sockets and share no such GPU). A node
    without any ``SYS`` link is one socket. Components of that relation,
    numbered by their lowest GPU.
    """
    n = snapshot.gpu_count
    sys = [[snapshot.link(i, j).label == "SYS" for j in range(n)] for i in range(n)]
    if not any(any(row) for row in sys):
        return (0,) * n
    near = [{j for j in range(n) if j != i and not sys[i][j]} for i in range(n)]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if sys[i][j]:
                continue
            if snapshot.link(i, j).is_nvlink and not (near[i] & near[j]) - {i, j}:
                continue
            parent[root(j)] = root(i)
    roots = [root(i) for i in range(n)]
    numbers = {r: k for k, r in enumerate(dict.fromkeys(roots))}
    return tuple(numbers[r] for r in roots)


@dataclass(frozen=True)
class TopologyClass:
    key: str
    wiring: Wiring
    ring: Floats
    pair: Floats
    nvlink_connected: NDArray[np.bool_]
    numa_span: NDArray[np.int8]
    socket_span: NDArray[np.int8]
    capability: Floats
    by_k: tuple[Masks, ...]  # by_k[k]: k-subsets sorted by (-ring, -pair, mask)
    ideal_ring: tuple[float, ...]  # ideal_ring[k]: best ring with every GPU free
    full_mask: int = field(default=0)

    @property
    def n(self) -> int:
        return self.wiring.n


def build_class(wiring: Wiring, size_mix: Mapping[int, float] = DEFAULT_SIZE_MIX) -> TopologyClass:
    n = wiring.n
    if n > EXACT_LIMIT:
        raise ValueError(f"exact tables are built for at most {EXACT_LIMIT} GPUs, not {n}")
    size = 1 << n
    masks = np.arange(size, dtype=np.int64)
    bits = ((masks[:, None] >> np.arange(n, dtype=np.int64)[None, :]) & 1).astype(np.float64)
    popcount = bits.sum(axis=1).astype(np.int64)
    pair = np.round(0.5 * np.einsum("mi,ij,mj->m", bits, wiring.bw, bits), 6)
    ring = _ring_bottlenecks(wiring.bw, masks, popcount)
    connected = _nvlink_connected(wiring.nvlink, masks)
    numa_span = _numa_span(wiring.gpu_numa, masks)
    socket_span = _numa_span(wiring.sockets, masks)
    by_k = tuple(_sorted_k_subsets(masks, popcount, ring, pair, k) for k in range(n + 1))
    ideal = tuple(float(ring[by_k[k][0]]) if by_k[k].size else 0.0 for k in range(n + 1))
    ideal_pair = tuple(float(pair[by_k[k][0]]) if by_k[k].size else 0.0 for k in range(n + 1))
    left = capability(ring, pair, popcount, n, ideal, ideal_pair, size_weights(size_mix, n))
    return TopologyClass(
        key=wiring.key(),
        wiring=wiring,
        ring=ring,
        pair=pair,
        nvlink_connected=connected,
        numa_span=numa_span,
        socket_span=socket_span,
        capability=left,
        by_k=by_k,
        ideal_ring=ideal,
        full_mask=size - 1,
    )


def _lowest_bit_index(masks: Masks) -> NDArray[np.int64]:
    low = masks & -masks
    out = np.zeros(masks.shape, dtype=np.int64)
    nonzero = low > 0
    out[nonzero] = np.log2(low[nonzero]).astype(np.int64)
    return out


def _ring_bottlenecks(bw: Floats, masks: Masks, popcount: NDArray[np.int64]) -> Floats:
    """ring[mask] for every subset: the best achievable ring bottleneck.

    best[mask, v] is the largest bottleneck of a path that starts at the
    lowest GPU of mask, visits every GPU of mask once and ends at v (-1: no
    such path). Layer p+1 is built from layer p, one target GPU u at a time,
    so each step is a vectorised min/max over all masks of the layer.
    """
    n = bw.shape[0]
    size = masks.size
    best = np.full((size, n), -1.0, dtype=np.float64)
    for i in range(n):
        best[1 << i, i] = np.inf
    low = _lowest_bit_index(masks)
    layers = [masks[popcount == p] for p in range(n + 1)]
    for p in range(1, n):
        layer = layers[p]
        if not layer.size:
            continue
        layer_low = low[layer]
        paths = best[layer]  # (m, n)
        for u in range(n):
            sel = ((layer >> u) & 1 == 0) & (layer_low < u)
            if not sel.any():
                continue
            extended = np.minimum(paths[sel], bw[:, u][None, :]).max(axis=1)
            target = layer[sel] | (1 << u)
            best[target, u] = np.maximum(best[target, u], extended)
    ring = np.zeros(size, dtype=np.float64)
    many = popcount >= 3
    closing = np.minimum(best[many], bw[:, low[many]].T)  # (m, n): close the cycle at low
    ring[many] = closing.max(axis=1)
    two = np.flatnonzero(popcount == 2)
    if two.size:
        first = low[two]
        second = _lowest_bit_index(two & ~(np.int64(1) << first))
        ring[two] = bw[first, second]
    return ring


def _nvlink_connected(nvlink: NDArray[np.bool_], masks: Masks) -> NDArray[np.bool_]:
    n = nvlink.shape[0]
    neighbours = [int(sum(1 << j for j in range(n) if nvlink[i, j])) for i in range(n)]
    reach = masks & -masks
    while True:
        grown = reach.copy()
        for v in range(n):
            has_v = ((reach >> v) & 1).astype(bool)
            grown[has_v] |= neighbours[v]
        grown &= masks
        if np.array_equal(grown, reach):
            break
        reach = grown
    return np.asarray(reach == masks, dtype=np.bool_)


def _numa_span(gpu_numa: tuple[int, ...], masks: Masks) -> NDArray[np.int8]:
    span = np.zeros(masks.shape, dtype=np.int8)
    for numa in sorted(set(gpu_numa)):
        group = sum(1 << i for i, g in enumerate(gpu_numa) if g == numa)
        span += ((masks & group) != 0).astype(np.int8)
    return span


def _sorted_k_subsets(
    masks: Masks, popcount: NDArray[np.int64], ring: Floats, pair: Floats, k: int
) -> Masks:
    subset = masks[popcount == k]
    order = np.lexsort((subset, -pair[subset], -ring[subset]))
    return np.ascontiguousarray(subset[order])
