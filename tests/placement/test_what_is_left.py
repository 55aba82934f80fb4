"""The "what is left" objective: ring and pair sum per size, weighted by the size mix."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from placement import ClusterState, PlacementRequest
from placement.bandwidth import DEFAULT_BANDWIDTH
from placement.node_choice import SetQuery, best_set, mask_to_indices
from placement.profiles import build_profile
from placement.topo_text import parse_topo_matrix
from placement.topology_class import TopologyClass, build_class, pcie_sockets, wiring_of
from placement.what_is_left import size_weights
from topoplace_client.samples import sample_text


def real(name: str, model: str) -> TopologyClass:
    snap = parse_topo_matrix(sample_text(name), gpu_model=model)
    return build_class(wiring_of(snap, DEFAULT_BANDWIDTH))


def holds_best_four(tc: TopologyClass, free: int) -> bool:
    best = tc.by_k[4][0]
    return any(
        m & free == m and tc.ring[m] == tc.ring[best] and tc.pair[m] == tc.pair[best]
        for m in tc.by_k[4].tolist()
    )


def test_v100_pair_keeps_a_quad_whole() -> None:
    """GPU 3 busy, 2 GPUs: [1,2] keeps the 4-7 quad whole; [0,4] splits both quads."""
    state = ClusterState()
    snap = build_profile("dgx1-v100", "n")
    state.upsert(snap)
    state.allocate("n", [snap.gpus[3].uuid])
    outcome = state.place(PlacementRequest(gpus=2))
    assert outcome.placement is not None
    assert outcome.placement.tasks[0].gpu_indices == (1, 2)


def test_every_v100_pair_choice_keeps_a_best_four_set_when_one_could() -> None:
    tc = build_class(wiring_of(build_profile("dgx1-v100", "n"), DEFAULT_BANDWIDTH))
    for free in range(1, 256):
        if free.bit_count() < 6:
            continue
        chosen = best_set(tc, free, SetQuery(k=2))
        could = any(
            holds_best_four(tc, free & ~m)
            for m in tc.by_k[2].tolist()
            if m & free == m and tc.ring[m] == tc.ring[chosen] and tc.pair[m] == tc.pair[chosen]
        )
        if could:
            assert holds_best_four(tc, free & ~chosen), mask_to_indices(free)


def test_l40s_fills_keep_a_socket_for_four_gpu_jobs() -> None:
    """Every fill of 1-, 2- and 4-GPU jobs on the real 8x L40S: no 4-GPU job crosses sockets."""
    tc = real("pcie-8x-l40s", "NVIDIA L40S")
    assert tc.ideal_ring[4] == 12.0  # NODE inside a socket; SYS (8) across
    for jobs in product((1, 2, 4), repeat=5):
        free = tc.full_mask
        for k in jobs:
            if free.bit_count() < k:
                break
            chosen = best_set(tc, free, SetQuery(k=k))
            if k == 4:
                assert tc.ring[chosen] == 12.0, jobs
            free &= ~chosen


def test_one_gpu_jobs_never_break_a_free_nvlink_pair() -> None:
    tc = real("dgx1-v100", "Tesla V100-SXM2-32GB")
    nvlink = tc.wiring.nvlink
    chances = 0
    for free in range(1, 256):
        members = mask_to_indices(free)
        lonely = [g for g in members if not any(nvlink[g, h] and free >> h & 1 for h in members)]
        if lonely and len(lonely) < len(members):
            chances += 1
            assert mask_to_indices(best_set(tc, free, SetQuery(k=1)))[0] in lonely
    assert chances > 0


def test_size_mix_decides_what_is_kept() -> None:
    """With only 5-GPU jobs expected, the same V100 choice keeps a 5-GPU ring instead."""
    snap = build_profile("dgx1-v100", "n")
    state = ClusterState(size_mix={5: 1.0})
    state.upsert(snap)
    state.allocate("n", [snap.gpus[3].uuid])
    outcome = state.place(PlacementRequest(gpus=2))
    assert outcome.placement is not None
    assert outcome.placement.tasks[0].gpu_indices == (0, 4)


def test_size_weights() -> None:
    w = size_weights({1: 3.0, 2: 1.0, 16: 1.0}, 8)
    assert w[0] == 0.0 and w.sum() == pytest.approx(1.0)
    assert w[1] > w[2] > w[3] > 0  # unseen sizes still count a little
    assert w[8] > w[2]  # 16 folds into the whole node
    assert np.all(np.diff(w[3:8]) > 0)  # unseen sizes: the larger, the more (keep big cells)
    with pytest.raises(ValueError):
        size_weights({1: -1.0}, 8)
    with pytest.raises(ValueError):
        size_weights({2: 0.0}, 8)
    with pytest.raises(ValueError):
        ClusterState(size_mix={0: 1.0})


def test_sockets_read_off_pcie_links_when_numa_data_contradicts_them() -> None:
    snap = parse_topo_matrix(sample_text("dgx1-v100"), gpu_model="Tesla V100-SXM2-32GB")
    # One CPU Affinity for all eight GPUs is one NUMA node, yet GPU 0 reaches GPU 5 over SYS.
    assert all(g.numa_node == 0 for g in snap.gpus)
    assert pcie_sockets(snap) == (0, 0, 0, 0, 1, 1, 1, 1)
    assert wiring_of(snap, DEFAULT_BANDWIDTH).sockets == (0, 0, 0, 0, 1, 1, 1, 1)
    hgx = build_profile("hgx-h100", "n")
    assert wiring_of(hgx, DEFAULT_BANDWIDTH).sockets == tuple(g.numa_node for g in hgx.gpus)


def test_ties_go_beside_busy_gpus_not_to_the_lowest_index() -> None:
    """Equal choices on the real DGX-1 (no NUMA data): the socket already in use, not GPU 0."""
    tc = real("dgx1-v100", "Tesla V100-SXM2-32GB")
    free = tc.full_mask & ~(1 << 5)  # GPU 5 busy, on the second socket
    chosen = mask_to_indices(best_set(tc, free, SetQuery(k=1)))
    assert chosen[0] >= 4
