"""Baseline GPU allocators the engine is compared against.

Two single-node policies, written from their published descriptions:

- ``first_fit``: the k lowest-index free GPUs. This is what a device plugin
  does when it hands out devices in enumeration order and ignores topology.
- ``partition_best_effort``: the "best effort" policy of NVIDIA's
  go-gpuallocator (used by the Kubernetes device plugin's
  GetPreferredAllocation): split the free GPUs into groups of size k, score
  each split, and hand out the best group of the best split.

and a cluster-level wrapper that mimics a Kubernetes cluster without a
topology-aware scheduler: the first node, in name order, on which the
device-level policy can place the request. (kube-scheduler's own default
scoring spreads by resource usage; "first feasible node in name order" is the
simple, deterministic stand-in named by the benchmark.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
from numpy.typing import NDArray

from placement.bandwidth import DEFAULT_BANDWIDTH, BandwidthTable
from placement.snapshot import Health, NodeSnapshot
from placement.topology_class import Wiring, wiring_of

Floats = NDArray[np.float64]
GpuSet = tuple[int, ...]
# Every single-node allocator shares this signature so the cluster wrapper can
# take any of them: (bandwidth matrix, free GPU indices ascending, k) -> set.
Allocator = Callable[[Floats, Sequence[int], int], GpuSet | None]

# Up to this many free GPUs every partition is enumerated; C(10) worst case is
# 2,800 partitions (k=3). At 16 free GPUs and k=2 it would be 2,027,025.
EXACT_PARTITION_LIMIT = 10


def first_fit(free: Sequence[int], k: int) -> GpuSet | None:
    """The k lowest-index free GPUs, or None when fewer than k are free."""
    if k < 1 or len(free) < k:
        return None
    return tuple(sorted(free)[:k])


def first_fit_allocator(bw: Floats, free: Sequence[int], k: int) -> GpuSet | None:
    """``first_fit`` with the common ``Allocator`` signature (it ignores ``bw``)."""
    del bw  # topology-blind by definition
    return first_fit(free, k)


def best_fit_gpus(free: Sequence[int], k: int) -> GpuSet | None:
    """Best-fit packing inside a node: the k lowest-index free GPUs.

    Best fit is a node-level rule (the node left with the least free); it
    says nothing about which GPUs, so the device plugin's enumeration order
    decides, as for first-fit.
    """
    return first_fit(free, k)


def slurm_greedy_gpus(
    free: Sequence[int], k: int, sockets: Sequence[int], bw: Floats | None = None
) -> GpuSet | None:
    """Slurm's select/cons_tres GPU pick, as its gres selection describes it.

    Sockets are taken in order of most free GPUs first (lowest socket on
    ties), all of one socket before the next, so a job that fits one socket
    stays on it; inside that order the first GPU is the lowest free one and
    each next one the GPU with the most link bandwidth to those picked
    (gres.conf ``Links``, which ``AutoDetect=nvml`` fills), lowest index on
    ties. Without ``bw`` the links are unknown and the order is by index.
    """
    if k < 1 or len(free) < k:
        return None
    by_socket: dict[int, list[int]] = {}
    for g in sorted(free):
        by_socket.setdefault(sockets[g] if g < len(sockets) else -1, []).append(g)
    order = sorted(by_socket, key=lambda s: (-len(by_socket[s]), s))
    picked: list[int] = []
    for socket in order:
        pool = list(by_socket[socket])
        while pool and len(picked) < k:
            if not picked or bw is None:
                pick = pool[0]
            else:
                members = tuple(picked)
                pick = max(pool, key=lambda g: (sum(float(bw[g, h]) for h in members), -g))
            picked.append(pick)
            pool.remove(pick)
        if len(picked) == k:
            break
    return tuple(sorted(picked))


def set_score(bw: Floats, gpus: Sequence[int]) -> float:
    """Sum of pairwise link scores of a set: go-gpuallocator's set score."""
    total = 0.0
    for a, b in combinations(gpus, 2):
        total += float(bw[a, b])
    return total


def partition_best_effort(bw: Floats, free: Sequence[int], k: int) -> GpuSet | None:
    """go-gpuallocator style "best effort" choice of k GPUs out of ``free``.

    The free GPUs are split into groups of size k; when k does not divide the
    number of free GPUs, the leftover GPUs form one smaller group (the Go code
    pads the device list with empty slots, which has the same effect). A
    group's score is the sum of its pairwise link scores (here: the
    bandwidth matrix ``bw``), a partition's score is the sum of its groups'
    scores. The answer is the best group of size k inside the best partition.
    The idea is that a good partition keeps the remaining GPUs well
    connected for later requests, not only the one handed out now.

    Bounds, stated on purpose: every partition is enumerated exactly when at
    most ``EXACT_PARTITION_LIMIT`` (10) GPUs are free. With more free GPUs the
    count explodes (2,027,025 pair partitions of 16 GPUs), so the partition
    is built greedily instead: while k or more GPUs remain, seed a group with
    the best-scoring remaining pair (lowest indices on ties) and grow it one
    GPU at a time by the GPU that adds the most score; the rest form the
    leftover group. Ties between equal partitions or groups go to the first
    one in enumeration order (groups formed around the lowest free GPU
    first), which may differ from the Go code's order but not its scores.

    Returns None when fewer than k GPUs are free.
    """
    items = tuple(sorted(free))
    m = len(items)
    if k < 1 or m < k:
        return None
    if k == m:
        return items
    if k == 1:
        # All groups score 0; the first group of the first partition wins.
        return (items[0],)
    if m <= EXACT_PARTITION_LIMIT:
        partition = _best_partition(bw, items, k)
    else:
        partition = _greedy_partition(bw, items, k)
    best: GpuSet | None = None
    best_score = -np.inf
    for group in partition:
        if len(group) != k:
            continue
        score = set_score(bw, group)
        if score > best_score:
            best, best_score = group, score
    return best


def _best_partition(bw: Floats, items: GpuSet, k: int) -> list[GpuSet]:
    best: list[GpuSet] = []
    best_score = -np.inf
    for partition in iterate_partitions(items, k):
        score = sum(set_score(bw, g) for g in partition)
        if score > best_score:
            best, best_score = partition, score
    return best


def iterate_partitions(items: GpuSet, k: int) -> Iterator[list[GpuSet]]:
    """Every split of ``items`` into groups of size k plus one leftover group.

    Each partition is produced once: the lowest remaining GPU always opens
    the next group, either a k-group or (once) the leftover group.
    """
    yield from _partitions(items, k, len(items) % k)


def _partitions(items: GpuSet, k: int, leftover: int) -> Iterator[list[GpuSet]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    if len(rest) >= k - 1 and len(items) - k >= leftover:
        for others in combinations(rest, k - 1):
            remaining = tuple(x for x in rest if x not in others)
            for tail in _partitions(remaining, k, leftover):
                yield [(first, *others), *tail]
    if leftover:
        for others in combinations(rest, leftover - 1):
            remaining = tuple(x for x in rest if x not in others)
            for tail in _partitions(remaining, k, 0):
                yield [(first, *others), *tail]


def _greedy_partition(bw: Floats, items: GpuSet, k: int) -> list[GpuSet]:
    remaining = list(items)
    groups: list[GpuSet] = []
    while len(remaining) >= k:
        seed = max(
            combinations(remaining, 2),
            key=lambda p: (float(bw[p[0], p[1]]), -p[0], -p[1]),
        )
        group = list(seed)
        pool = [g for g in remaining if g not in group]
        while len(group) < k:
            members = tuple(group)
            pick = max(pool, key=lambda g: (sum(float(bw[g, h]) for h in members), -g))
            group.append(pick)
            pool.remove(pick)
        groups.append(tuple(sorted(group)))
        remaining = pool
    if remaining:
        groups.append(tuple(remaining))
    return groups


# Cluster level -------------------------------------------------------------


@dataclass(frozen=True)
class BaselineNode:
    """What a topology-blind scheduler plus device plugin know about a node."""

    name: str
    wiring: Wiring
    class_key: str  # equal wiring, equal answers: keys the allocator cache
    models: tuple[str, ...]  # per GPU, upper-cased for substring matching
    usable: int  # mask of GPUs whole-GPU requests may get (healthy, no MIG)
    uuids: tuple[str, ...]


@dataclass
class BaselineCluster:
    """Free GPUs per node, nodes in name order, for the baseline allocators.

    ``place_first_fit`` / ``place_best_effort`` only answer; ``allocate``
    commits, the same split as the engine's ``place`` and ``apply``.
    """

    nodes: list[BaselineNode]
    free: NDArray[np.int64]  # per node, mask of free usable GPUs
    _index: dict[str, int] = field(default_factory=dict)
    _eligible: dict[tuple[str, ...], NDArray[np.int64]] = field(default_factory=dict)
    _answers: dict[tuple[str, str, int, int], GpuSet | None] = field(default_factory=dict)

    @classmethod
    def from_snapshots(
        cls, snapshots: Sequence[NodeSnapshot], bandwidth: BandwidthTable = DEFAULT_BANDWIDTH
    ) -> BaselineCluster:
        nodes = []
        for snap in sorted(snapshots, key=lambda s: s.name):
            usable = sum(
                1 << g.index for g in snap.gpus if not g.mig_enabled and g.health is Health.HEALTHY
            )
            wiring = wiring_of(snap, bandwidth)
            nodes.append(
                BaselineNode(
                    name=snap.name,
                    wiring=wiring,
                    class_key=wiring.key(),
                    models=tuple(g.model.upper() for g in snap.gpus),
                    usable=usable,
                    uuids=tuple(g.uuid for g in snap.gpus),
                )
            )
        free = np.asarray([n.usable for n in nodes], dtype=np.int64)
        cluster = cls(nodes=nodes, free=free)
        cluster._index = {n.name: i for i, n in enumerate(nodes)}
        return cluster

    def eligible(self, gpu_models: tuple[str, ...]) -> NDArray[np.int64]:
        """Per node, the GPUs whose model matches (case-insensitive substring, as the engine)."""
        key = tuple(m.upper() for m in gpu_models)
        cached = self._eligible.get(key)
        if cached is None:
            cached = np.asarray(
                [
                    sum(
                        1 << i
                        for i, model in enumerate(node.models)
                        if not key or any(m in model for m in key)
                    )
                    for node in self.nodes
                ],
                dtype=np.int64,
            )
            self._eligible[key] = cached
        return cached

    def place(
        self, allocator: Allocator, name: str, k: int, gpu_models: tuple[str, ...] = ()
    ) -> tuple[str, GpuSet] | None:
        """First node in name order where ``allocator`` returns a set; nothing is reserved.

        ``name`` keys the answer cache: a deterministic allocator's answer
        depends only on the node's wiring, its free mask and k.
        """
        free = self.free & self.eligible(gpu_models)
        for i in np.flatnonzero(np.bitwise_count(free) >= k).tolist():
            node = self.nodes[i]
            mask = int(free[i])
            key = (name, node.class_key, mask, k)
            if key in self._answers:
                chosen = self._answers[key]
            else:
                chosen = allocator(node.wiring.bw, _indices(mask), k)
                self._answers[key] = chosen
            if chosen is not None:
                return node.name, chosen
        return None

    def allocate(self, node: str, gpus: Sequence[int]) -> None:
        i = self._index[node]
        mask = sum(1 << g for g in gpus)
        if int(self.free[i]) & mask != mask:
            raise ValueError(f"GPUs {list(gpus)} on {node} are not all free")
        self.free[i] = int(self.free[i]) & ~mask

    def node(self, name: str) -> BaselineNode:
        return self.nodes[self._index[name]]

    def free_gpus(self) -> int:
        return int(np.bitwise_count(self.free).sum())


def place_first_fit(
    cluster: BaselineCluster, k: int, gpu_models: tuple[str, ...] = ()
) -> tuple[str, GpuSet] | None:
    """First feasible node in name order, lowest-index free GPUs there."""
    return cluster.place(first_fit_allocator, "first-fit", k, gpu_models)


def place_best_effort(
    cluster: BaselineCluster, k: int, gpu_models: tuple[str, ...] = ()
) -> tuple[str, GpuSet] | None:
    """First feasible node in name order, go-gpuallocator best effort there."""
    return cluster.place(partition_best_effort, "best-effort", k, gpu_models)


def _indices(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]
