"""The exact search against brute force on many random topologies and free masks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.node_choice import NO_SET, SetQuery, best_set, indices_to_mask, mask_to_indices
from placement.topology_class import Wiring, build_class
from tests.placement.reference import best_value, nvlink_connected, pair_sum, ring_bruteforce

LEVELS = (8.0, 12.0, 16.0, 20.0, 24.0, 25.0, 50.0, 100.0, 450.0)


def random_wiring(rng: np.random.Generator, n: int) -> Wiring:
    levels = rng.choice(LEVELS, size=rng.integers(2, 6), replace=False)
    bw = np.triu(rng.choice(levels, size=(n, n)), 1)
    bw = bw + bw.T
    numa = tuple(int(x) for x in sorted(rng.integers(0, rng.integers(1, 4), size=n)))
    return Wiring(bw=bw, nvlink=bw >= 25.0, gpu_numa=numa)


def check(wiring: Wiring, free: int, k: int, **flags: bool) -> None:
    tc = build_class(wiring)
    query = SetQuery(k=k, **flags)
    got = best_set(tc, free, query)
    free_idx = mask_to_indices(free)
    want = best_value(
        wiring.bw,
        wiring.nvlink,
        wiring.gpu_numa,
        free_idx,
        k,
        require_nvlink=flags.get("require_nvlink", False),
        numa_required=flags.get("numa_required", False),
    )
    if want is None:
        assert got == NO_SET
        return
    assert got != NO_SET
    members = mask_to_indices(got)
    assert len(members) == k and got & ~free == 0
    if flags.get("require_nvlink"):
        assert nvlink_connected(wiring.nvlink, members)
    if flags.get("numa_required"):
        assert len({wiring.gpu_numa[i] for i in members}) == 1
    value = (ring_bruteforce(wiring.bw, members), round(pair_sum(wiring.bw, members), 6))
    assert value == want, f"free={free_idx} k={k}: chose {members} {value}, optimum {want}"
    assert tc.ring[got] == pytest.approx(value[0]) and tc.pair[got] == pytest.approx(value[1])


@pytest.mark.parametrize("seed", range(40))
def test_optimal_on_random_topologies_every_k(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 10))
    wiring = random_wiring(rng, n)
    for _ in range(4):
        free = int(rng.integers(1, 1 << n))
        for k in range(1, bin(free).count("1") + 1):
            check(wiring, free, k)
            check(wiring, free, k, require_nvlink=True)
            check(wiring, free, k, numa_required=True)


@pytest.mark.parametrize("seed", range(8))
def test_optimal_on_16_gpu_topologies(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    wiring = random_wiring(rng, 16)
    for _ in range(3):
        # brute force over all subsets of 16 is slow in pure Python: free at most 10
        free_idx = rng.choice(16, size=int(rng.integers(2, 11)), replace=False)
        free = indices_to_mask([int(i) for i in free_idx])
        for k in range(1, len(free_idx) + 1):
            check(wiring, free, k)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_optimal_property(data: st.DataObject) -> None:
    n = data.draw(st.integers(2, 8))
    seed = data.draw(st.integers(0, 2**32 - 1))
    wiring = random_wiring(np.random.default_rng(seed), n)
    free = data.draw(st.integers(1, (1 << n) - 1))
    k = data.draw(st.integers(1, bin(free).count("1")))
    check(wiring, free, k, require_nvlink=data.draw(st.booleans()))


def test_ring_table_matches_bruteforce_for_every_subset() -> None:
    rng = np.random.default_rng(7)
    wiring = random_wiring(rng, 9)
    tc = build_class(wiring)
    for mask in range(1 << 9):
        members = mask_to_indices(mask)
        if len(members) <= 8:
            assert tc.ring[mask] == ring_bruteforce(wiring.bw, members)


def test_full_16_gpu_optimum_against_thresholded_reference() -> None:
    # Every k on a fully free 16-GPU island design (two NVSwitch halves over PCIe).
    n = 16
    bw = np.full((n, n), 8.0)
    for half in (range(0, 8), range(8, 16)):
        for a in half:
            for b in half:
                bw[a, b] = 300.0
    np.fill_diagonal(bw, 0.0)
    tc = build_class(Wiring(bw=bw, nvlink=bw >= 25, gpu_numa=(0,) * 8 + (1,) * 8))
    for k in range(1, n + 1):
        chosen = mask_to_indices(best_set(tc, (1 << n) - 1, SetQuery(k=k)))
        expected_ring = 300.0 if 2 <= k <= 8 else (0.0 if k == 1 else 8.0)
        assert ring_bruteforce(bw, chosen) == expected_ring
        if k <= 8:
            assert len({i // 8 for i in chosen}) == 1


def test_one_gpu_job_never_breaks_a_free_nvlink_pair() -> None:
    # 3 GPUs: 0-1 share an NVLink bridge, 2 is alone on PCIe.
    bw = np.array([[0, 100, 12], [100, 0, 12], [12, 12, 0]], dtype=float)
    tc = build_class(Wiring(bw=bw, nvlink=bw >= 25, gpu_numa=(0, 0, 0)))
    assert mask_to_indices(best_set(tc, 0b111, SetQuery(k=1))) == (2,)


def test_one_gpu_job_takes_the_gpu_whose_partners_are_busy() -> None:
    # Two NVLink pairs (0-1, 2-3); GPU 1 busy: a 1-GPU job takes GPU 0, keeping 2-3 whole.
    bw = np.full((4, 4), 12.0)
    bw[0, 1] = bw[1, 0] = bw[2, 3] = bw[3, 2] = 100.0
    np.fill_diagonal(bw, 0)
    tc = build_class(Wiring(bw=bw, nvlink=bw >= 25, gpu_numa=(0,) * 4))
    assert mask_to_indices(best_set(tc, 0b1101, SetQuery(k=1))) == (0,)


def test_balanced_trades_bounded_ring_for_less_fragmentation() -> None:
    # Pairs 0-1 and 2-3 at 100 GB/s, 4-5 at 50, everything else 12: a 2-GPU
    # performance job breaks a 100 pair; balanced (50% loss allowed) takes 4-5.
    bw = np.full((6, 6), 12.0)
    for a, b, v in ((0, 1, 100.0), (2, 3, 100.0), (4, 5, 50.0)):
        bw[a, b] = bw[b, a] = v
    np.fill_diagonal(bw, 0)
    tc = build_class(Wiring(bw=bw, nvlink=bw >= 25, gpu_numa=(0,) * 6))
    full = (1 << 6) - 1
    assert mask_to_indices(best_set(tc, full, SetQuery(k=2))) in ((0, 1), (2, 3))
    balanced = SetQuery(k=2, balanced=True, max_ring_loss=0.5)
    assert mask_to_indices(best_set(tc, full, balanced)) == (4, 5)
    strict = SetQuery(k=2, balanced=True, max_ring_loss=0.1)
    assert mask_to_indices(best_set(tc, full, strict)) in ((0, 1), (2, 3))


def test_numa_breaks_remaining_ties() -> None:
    # All-to-all NVSwitch: every 4-set ties on bandwidth; take one NUMA node.
    bw = np.full((8, 8), 450.0)
    np.fill_diagonal(bw, 0)
    tc = build_class(Wiring(bw=bw, nvlink=bw > 0, gpu_numa=(0,) * 4 + (1,) * 4))
    chosen = mask_to_indices(best_set(tc, 0xFF, SetQuery(k=4)))
    assert len({i // 4 for i in chosen}) == 1


def test_impossible_requests() -> None:
    bw = np.full((4, 4), 8.0)
    np.fill_diagonal(bw, 0)
    tc = build_class(Wiring(bw=bw, nvlink=bw >= 25, gpu_numa=(0, 0, 1, 1)))
    assert best_set(tc, 0b1111, SetQuery(k=5)) == NO_SET
    assert best_set(tc, 0b1111, SetQuery(k=2, require_nvlink=True)) == NO_SET
    assert best_set(tc, 0b0101, SetQuery(k=2, numa_required=True)) == NO_SET
    assert best_set(tc, 0b0011, SetQuery(k=2, numa_required=True)) == 0b0011
