"""The benchmark's baselines do what their docstrings say; the quality core runs."""

from __future__ import annotations

import math
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from bench.baselines import (
    EXACT_PARTITION_LIMIT,
    BaselineCluster,
    first_fit,
    iterate_partitions,
    partition_best_effort,
    place_best_effort,
    place_first_fit,
    set_score,
)
from bench.quality import (
    design_classes,
    fragmented_cases,
    replay,
    summarize,
    two_island_wiring,
)
from bench.trace import Pod, TraceNode, node_snapshot, read_pods, slice_snapshot
from placement.bandwidth import bandwidth_matrix, nvlink_adjacency
from placement.profiles import build_profile


@pytest.fixture(scope="module")
def dgx1_bw() -> np.ndarray:
    return bandwidth_matrix(build_profile("dgx1-v100", "dgx1"))


def test_first_fit_takes_the_lowest_free_indices() -> None:
    assert first_fit([7, 1, 5, 3], 2) == (1, 3)
    assert first_fit([2, 4, 6], 3) == (2, 4, 6)


@pytest.mark.parametrize("k", [3, 4])
def test_allocators_answer_none_without_enough_free_gpus(dgx1_bw: np.ndarray, k: int) -> None:
    assert first_fit([0, 5], k) is None
    assert partition_best_effort(dgx1_bw, [0, 5], k) is None


def test_partitions_are_each_counted_once() -> None:
    # m GPUs into a groups of k and one leftover of r: m! / (k!^a a! r!).
    for m in range(2, 10):
        for k in range(2, m):
            a, r = divmod(m, k)
            want = math.factorial(m) // (math.factorial(k) ** a * math.factorial(a))
            want //= math.factorial(r)
            got = list(iterate_partitions(tuple(range(m)), k))
            assert len(got) == want
            assert len({tuple(sorted(p)) for p in got}) == want
            for partition in got:
                assert sorted(g for group in partition for g in group) == list(range(m))


def test_best_effort_picks_a_cube_face_quad_on_dgx1(dgx1_bw: np.ndarray) -> None:
    chosen = partition_best_effort(dgx1_bw, list(range(8)), 4)
    assert chosen is not None
    best_quad = max(set_score(dgx1_bw, q) for q in combinations(range(8), 4))
    assert set_score(dgx1_bw, chosen) == best_quad
    assert set(chosen) in ({0, 1, 2, 3}, {4, 5, 6, 7})


def test_best_effort_prefers_a_double_nvlink_pair(dgx1_bw: np.ndarray) -> None:
    # Free 0,1,2,5,6: first fit would take 0-1 (NV1); 1-2 and 5-6 are NV2.
    chosen = partition_best_effort(dgx1_bw, [0, 1, 2, 5, 6], 2)
    assert chosen is not None
    assert dgx1_bw[chosen[0], chosen[1]] == dgx1_bw.max()
    assert first_fit([0, 1, 2, 5, 6], 2) == (0, 1)


def test_best_effort_edge_sizes(dgx1_bw: np.ndarray) -> None:
    assert partition_best_effort(dgx1_bw, [6, 2, 4], 3) == (2, 4, 6)
    assert partition_best_effort(dgx1_bw, [6, 2, 4], 1) == (2,)


def test_best_effort_greedy_fallback_keeps_islands() -> None:
    bw = two_island_wiring().bw
    free = list(range(2, 16))  # 14 free: above the exact limit
    assert len(free) > EXACT_PARTITION_LIMIT
    for k in (2, 4, 6):
        chosen = partition_best_effort(bw, free, k)
        assert chosen is not None and len(chosen) == k
        assert len({g // 8 for g in chosen}) == 1


def test_cluster_wrapper_takes_the_first_feasible_node_by_name() -> None:
    snaps = [
        build_profile("dgx1-v100", "b-node"),
        slice_snapshot(build_profile("pcie-8x-l40s", "a-node"), 2, "T4"),
    ]
    cluster = BaselineCluster.from_snapshots(snaps)
    assert place_first_fit(cluster, 2) == ("a-node", (0, 1))
    assert place_first_fit(cluster, 4) == ("b-node", (0, 1, 2, 3))
    got = place_best_effort(cluster, 2, ("V100",))
    assert got is not None and got[0] == "b-node"
    cluster.allocate("a-node", [0, 1])
    assert place_first_fit(cluster, 1) == ("b-node", (0,))
    assert place_first_fit(cluster, 9) is None
    assert cluster.free_gpus() == 8


def test_trace_nodes_map_to_profile_slices() -> None:
    quad = node_snapshot(TraceNode("openb-node-0001", 4, "V100M16"))
    assert [g.model for g in quad.gpus] == ["V100M16"] * 4
    assert nvlink_adjacency(quad).sum() == 12  # GPUs 0-3 of a DGX-1: all pairs NVLink
    assert [n.id for n in quad.numa_nodes] == [0]
    pair = node_snapshot(TraceNode("openb-node-0002", 2, "T4"))
    assert not nvlink_adjacency(pair).any()
    assert pair.gpus[0].model == "T4" and pair.gpus[0].memory_mib == 15360


def test_read_pods_keeps_whole_gpu_pods_and_counts_the_rest(tmp_path: Path) -> None:
    (tmp_path / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n"
        "p0,1000,1024,0,0,\n"
        "p1,1000,1024,1,500,\n"
        "p2,1000,1024,2,1000,V100M16|V100M32\n"
        "p3,1000,1024,1,1000,\n"
    )
    pods = read_pods("pods.csv", tmp_path)
    assert (pods.total, pods.cpu_only, pods.sharing) == (4, 1, 1)
    assert pods.pods == (
        Pod("p2", 2, ("V100M16", "V100M32")),
        Pod("p3", 1, ()),
    )
    assert read_pods("pods.csv", tmp_path, limit=2).pods == ()


def test_engine_ring_is_never_below_the_baselines_on_fragmented_nodes() -> None:
    classes = design_classes(("dgx1-v100", "pcie-8x-l40s"))
    cases = fragmented_cases(classes, (0.5, 0.7), samples=20, seed=3)
    assert cases
    s = summarize("all", cases)
    assert s.ge_first_fit == 1.0 and s.ge_best_effort == 1.0
    assert s.engine >= s.best_effort and s.engine >= s.first_fit


def test_replay_smoke_on_a_tiny_cluster() -> None:
    snaps = [
        build_profile("dgx1-v100", "n1"),
        build_profile("dgx1-v100", "n2"),
        slice_snapshot(build_profile("pcie-8x-l40s", "n0"), 2, "T4"),
    ]
    pods = [Pod(f"p{i}", k, ()) for i, k in enumerate([1, 2, 1, 4, 2, 1, 3, 2])]
    results = {a: replay(snaps, pods, a) for a in ("engine", "first-fit", "best-effort")}
    for r in results.values():
        assert r.failed_pod is not None  # cycling fills the 18 GPUs
        assert r.total_gpus == 18
        assert r.allocated_end <= 18
        assert r.placed_end >= r.placed_before > 0
        assert r.mismatches == 0
    engine = results["engine"]
    assert engine.mean_ring >= results["first-fit"].mean_ring
    assert engine.mean_ring >= results["best-effort"].mean_ring
