"""Nodes above the exact tables' GPU count: searched as the seed-by-seed loop did, kept."""

from __future__ import annotations

import functools
import random

import numpy as np
import pytest

from bench.engine_speed import large_node
from placement import ClusterState, NodeSnapshot, PlacementRequest
from placement.bandwidth import DEFAULT_BANDWIDTH, BandwidthTable
from placement.large_node import LargeClass, _ring_exact
from placement.node_choice import NO_SET, SetQuery
from placement.snapshot import Gpu, NumaNode
from placement.topology_class import _ring_bottlenecks
from tests.placement.reference import large_best_set, ring_bruteforce

GPUS = 40


def _large_node(n: int = GPUS) -> NodeSnapshot:
    """n GPUs in NVLink islands of 8, two NUMA nodes (the engine benchmark's large node)."""
    return large_node(n, "big")


class _Searches:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        grow = LargeClass._grown

        def counted(tc: LargeClass, *args: object) -> set[int]:
            self.count += 1
            return grow(tc, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(LargeClass, "_grown", counted)


def test_a_large_node_answers_the_same_question_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every /score of a 63-GPU node searched its best sets from scratch (62-71 ms a call);
    # the answer is a function of the node's design, its free GPUs and the query shape.
    state = ClusterState()
    state.upsert(_large_node())
    searches = _Searches(monkeypatch)
    first = state.evaluate(PlacementRequest(gpus=4))
    assert searches.count > 0
    searches.count = 0
    assert state.evaluate(PlacementRequest(gpus=4)) == first
    assert searches.count == 0


def test_a_changed_free_set_is_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClusterState()
    state.upsert(_large_node())
    before = state.evaluate(PlacementRequest(gpus=4))[0].task
    assert before is not None
    state.allocate("big", before.gpu_uuids)
    searches = _Searches(monkeypatch)
    after = state.evaluate(PlacementRequest(gpus=4))[0].task
    assert searches.count > 0
    assert after is not None and not set(after.gpu_uuids) & set(before.gpu_uuids)


def test_kept_answers_are_bounded() -> None:
    from placement.large_node import LARGE_ANSWERS

    state = ClusterState()
    state.upsert(_large_node())
    tc = state.topology_class("big")
    assert isinstance(tc, LargeClass)
    for free in range(1, 3 * 64):
        tc.best_set(free << 1, SetQuery(k=1))
    assert 0 < tc.kept_answers <= LARGE_ANSWERS
    assert LARGE_ANSWERS <= 4096


LABELS = ("NV1", "NV2", "NV4", "NV12", "NV18", "NVS18", "PIX", "PXB", "PHB", "NODE", "SYS")


def _wired(n: int, seed: int, name: str = "big", numa: int = 2) -> NodeSnapshot:
    """n GPUs, every pair's link drawn at random (the worst case for a greedy search)."""
    rng = random.Random(seed)
    links = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            links[i][j] = links[j][i] = rng.choice(LABELS)
    return NodeSnapshot(
        name=name,
        gpus=[
            Gpu(index=i, uuid=f"{name}-{i}", model="H100", numa_node=rng.randrange(numa))
            for i in range(n)
        ],
        links=links,
        numa_nodes=[NumaNode(id=k, cpus=f"{k * 8}-{k * 8 + 7}") for k in range(numa)],
    )


def _uniform(n: int, label: str, name: str = "big") -> NodeSnapshot:
    """n GPUs, every pair on the same link (NVSwitch-like when an NVLink label)."""
    links = [["X" if i == j else label for j in range(n)] for i in range(n)]
    return NodeSnapshot(
        name=name,
        gpus=[Gpu(index=i, uuid=f"{name}-{i}", model="H100", numa_node=i % 2) for i in range(n)],
        links=links,
        numa_nodes=[NumaNode(id=k, cpus=f"{k * 8}-{k * 8 + 7}") for k in range(2)],
    )


# Rates with decimals: sums taken in another order must still compare as pair() does.
ODD_RATES = BandwidthTable(
    nvlink_lane_gbps={"hopper": 26.3}, pcie_gbps={"PIX": 23.7, "NODE": 11.1, "SYS": 7.3}
)


@pytest.mark.parametrize(
    ("snapshot", "bandwidth", "seed"),
    [
        (_wired(40, 1), DEFAULT_BANDWIDTH, 1),
        (_wired(24, 2, numa=4), ODD_RATES, 2),
        (_uniform(33, "NV18"), DEFAULT_BANDWIDTH, 3),
        (_large_node(), ODD_RATES, 4),
    ],
    ids=["random-40", "random-24-odd-rates", "nvswitch-33", "islands-40-odd-rates"],
)
def test_the_search_answers_as_the_seed_by_seed_search(
    snapshot: NodeSnapshot, bandwidth: BandwidthTable, seed: int
) -> None:
    # The search grew one set per seed one GPU at a time in Python and computed every
    # set's ring (125 ms at the median for 8 GPUs of 63: every /place beside such a node
    # paid it). It now grows every seed at once and computes rings best bound first; the
    # set it picks must be the one the original loop picked, float ties and all.
    state = ClusterState(bandwidth=bandwidth)
    state.upsert(snapshot)
    tc = state.topology_class(snapshot.name)
    assert isinstance(tc, LargeClass)
    rng = random.Random(seed)
    compared = 0
    for _ in range(24):
        free = sum(1 << i for i in range(tc.n) if rng.random() < rng.choice((0.35, 0.7, 1.0)))
        query = SetQuery(
            k=rng.choice((1, 2, 3, 4, 6, 8, 12, 13, 16)),
            require_nvlink=rng.random() < 0.3,
            numa_required=rng.random() < 0.3,
        )
        assert tc.best_set(free, query) == large_best_set(tc, free, query), (free, query)
        compared += tc.best_set(free, query) != NO_SET
    assert compared >= 12  # most draws have an answer to compare


def test_a_large_node_ring_is_the_best_ring_up_to_the_exact_limit() -> None:
    # Sets whose greedy tour reaches the upper bound skip the exact search: the ring
    # reported must still be the best over every cyclic order.
    state = ClusterState()
    state.upsert(_wired(30, 5))
    tc = state.topology_class("big")
    assert isinstance(tc, LargeClass)
    rng = random.Random(5)
    for _ in range(60):
        members = tuple(sorted(rng.sample(range(30), rng.randint(2, 7))))
        mask = sum(1 << i for i in members)
        assert tc.ring(mask) == ring_bruteforce(tc.wiring.bw, members), members


def test_a_search_computes_the_rings_of_few_sets(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every grown set's ring was computed (one exact search, up to 11 ms, per seed: 63 a
    # search on a 63-GPU node). On uniform wiring every set has the same ring, bound and
    # pair: the first set computed settles it.
    state = ClusterState()
    state.upsert(_uniform(63, "NV18"))
    tc = state.topology_class("big")
    assert isinstance(tc, LargeClass)
    rings: list[int] = []
    exact = LargeClass._ring_uncached

    def counted(self: LargeClass, mask: int) -> float:
        rings.append(mask)
        return exact(self, mask)

    monkeypatch.setattr(LargeClass, "_ring_uncached", counted)
    tc._ring.cache_clear()
    tc._ring = functools.lru_cache(maxsize=65536)(functools.partial(counted, tc))
    for k in (3, 8, 12):
        rings.clear()
        assert tc.best_set(tc.full_mask & ~0b1011, SetQuery(k=k)) != NO_SET
        assert len(rings) <= 2, (k, len(rings))


def test_the_one_set_ring_search_agrees_with_the_table_search() -> None:
    # A large node's exact ring (sets up to 12 GPUs) walks only the paths from the set's
    # first GPU; the exact tables walk every subset. The best ring is the same number.
    rng = np.random.default_rng(12)
    rates = np.array([8.0, 12.0, 16.0, 20.0, 24.0, 25.0, 50.0, 100.0, 300.0, 450.0])
    for k in (3, 5, 8, 10, 12):
        for _ in range(6):
            links = np.triu(rng.choice(rates, size=(k, k)), 1)
            links = links + links.T
            masks = np.arange(1 << k, dtype=np.int64)
            sizes = np.array([bin(m).count("1") for m in range(1 << k)], dtype=np.int64)
            assert _ring_exact(links) == _ring_bottlenecks(links, masks, sizes)[-1]
