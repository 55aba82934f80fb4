"""Cluster-level choice: policies, locality, constraints, outcomes and the contract."""

from __future__ import annotations

import pytest

from placement import (
    AllocationError,
    Cause,
    ClusterState,
    Health,
    NodeSnapshot,
    PlacementRequest,
    UnknownNodeError,
)
from placement.profiles import build_profile
from tests.placement.conftest import uuids


def test_four_gpus_land_in_one_nvlink_quad(dgx1_cluster: ClusterState) -> None:
    outcome = dgx1_cluster.place(PlacementRequest(gpus=4))
    assert outcome.status == "placed" and outcome.placement is not None
    task = outcome.placement.tasks[0]
    assert task.gpu_indices in ((0, 1, 2, 3), (4, 5, 6, 7))
    assert task.nvlink_connected and task.score.ring_gbps == 25.0
    assert task.score.numa_nodes == 1
    assert task.gpu_uuids == tuple(uuids(dgx1_cluster, task.node, list(task.gpu_indices)))
    assert "ring 25 GB/s" in task.reason


def test_pack_fills_the_busiest_node_and_spread_the_emptiest(dgx1_cluster: ClusterState) -> None:
    dgx1_cluster.allocate("dgx1", uuids(dgx1_cluster, "dgx1", [0, 1, 2, 3]))
    pack = dgx1_cluster.place(PlacementRequest(gpus=4, policy="pack"))
    spread = dgx1_cluster.place(PlacementRequest(gpus=4, policy="spread"))
    assert pack.placement and pack.placement.tasks[0].node == "dgx1"
    assert pack.placement.tasks[0].gpu_indices == (4, 5, 6, 7)
    assert spread.placement and spread.placement.tasks[0].node == "dgx0"


def test_bandwidth_quality_outranks_packing(dgx1_cluster: ClusterState) -> None:
    # dgx1 has only a cross-socket pair left (0 and 5: SYS); dgx0 can give an NV2 pair.
    dgx1_cluster.allocate("dgx1", uuids(dgx1_cluster, "dgx1", [1, 2, 3, 4, 6, 7]))
    outcome = dgx1_cluster.place(PlacementRequest(gpus=2))
    assert outcome.placement and outcome.placement.tasks[0].node != "dgx1"
    assert outcome.placement.tasks[0].score.ring_gbps == 50.0


def test_locality_nvlink_refuses_split_sets_and_says_why() -> None:
    state = ClusterState()
    state.upsert(build_profile("pcie-8x-l40s", "pcie0"))
    outcome = state.place(PlacementRequest(gpus=2, locality="nvlink"))
    assert outcome.status == "unresolvable"
    assert outcome.reasons[0].cause is Cause.NO_NVLINK_SET_EVER
    assert outcome.summary() == "1 node: no 2 GPUs connected by NVLink on this node design"
    assert state.place(PlacementRequest(gpus=2, locality="any")).status == "placed"


def test_nvlink_now_versus_ever(dgx1_cluster: ClusterState) -> None:
    for node in ("dgx0", "dgx1", "dgx2"):
        dgx1_cluster.allocate(node, uuids(dgx1_cluster, node, [1, 2, 3, 4, 6, 7]))
    outcome = dgx1_cluster.place(PlacementRequest(gpus=2, locality="nvlink"))
    assert outcome.status == "unschedulable"
    assert outcome.summary() == "3 nodes: no NVLink island with 2 GPUs free"
    prefer = dgx1_cluster.place(PlacementRequest(gpus=2, locality="prefer"))
    assert prefer.placement and prefer.placement.tasks[0].gpu_indices == (0, 5)


def test_sixteen_nvlink_gpus_on_8_gpu_nodes_is_unresolvable(dgx1_cluster: ClusterState) -> None:
    outcome = dgx1_cluster.place(PlacementRequest(gpus=16, locality="nvlink"))
    assert outcome.status == "unresolvable"
    # Said of the cluster, not of each node: it has 24 GPUs, but no node has 16.
    assert outcome.summary() == "no node has 16 GPUs; the largest has 8"
    assert [(g.cause, g.nodes) for g in outcome.reasons] == [(Cause.TOO_FEW_GPUS, 3)]


def test_busy_cluster_is_unschedulable_with_grouped_reasons(dgx1_cluster: ClusterState) -> None:
    for node in ("dgx0", "dgx1"):
        dgx1_cluster.allocate(node, uuids(dgx1_cluster, node, list(range(6))))
    dgx1_cluster.set_available("dgx2", False)
    outcome = dgx1_cluster.place(PlacementRequest(gpus=4))
    assert outcome.status == "unschedulable"
    assert [(g.cause, g.nodes) for g in outcome.reasons] == [
        (Cause.BUSY, 2),
        (Cause.UNAVAILABLE, 1),
    ]


def test_constraints_model_memory_labels_regions() -> None:
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0", region="eu-west", labels={"pool": "train"}))
    state.upsert(build_profile("dgx1-v100", "v0", region="us-east"))
    assert _node(state, PlacementRequest(gpus=2, gpu_models=("h100",))) == "h0"
    assert _node(state, PlacementRequest(gpus=2, regions=("us-east",))) == "v0"
    assert _node(state, PlacementRequest(gpus=2, node_labels={"pool": "train"})) == "h0"
    assert _node(state, PlacementRequest(gpus=2, min_gpu_memory_mib=60_000)) == "h0"
    outcome = state.place(PlacementRequest(gpus=2, gpu_models=("B200",)))
    assert outcome.status == "unresolvable"
    assert {g.cause for g in outcome.reasons} == {Cause.GPU_MODEL}


def _node(state: ClusterState, request: PlacementRequest) -> str:
    outcome = state.place(request)
    assert outcome.placement is not None, outcome.summary()
    return outcome.placement.tasks[0].node


def test_unhealthy_gpu_is_never_chosen_and_is_resolvable() -> None:
    snap = build_profile("workstation-2x-a6000", "ws0")
    sick = snap.model_copy(
        update={
            "gpus": [snap.gpus[0].model_copy(update={"health": Health.UNHEALTHY}), snap.gpus[1]]
        }
    )
    state = ClusterState()
    state.upsert(sick)
    assert _node(state, PlacementRequest(gpus=1)) == "ws0"
    assert state.place(PlacementRequest(gpus=1)).placement.tasks[0].gpu_indices == (1,)  # type: ignore[union-attr]
    outcome = state.place(PlacementRequest(gpus=2))
    assert outcome.status == "unschedulable" and outcome.reasons[0].cause is Cause.UNHEALTHY


def test_allocate_refuses_double_booking_and_changes_nothing(dgx1_cluster: ClusterState) -> None:
    gpus = uuids(dgx1_cluster, "dgx0", [0, 1])
    dgx1_cluster.allocate("dgx0", gpus)
    with pytest.raises(AllocationError, match="already allocated"):
        dgx1_cluster.allocate("dgx0", [*uuids(dgx1_cluster, "dgx0", [2]), gpus[1]])
    assert dgx1_cluster.node("dgx0").held_gpus == set(gpus)
    with pytest.raises(AllocationError, match="has no GPU"):
        dgx1_cluster.allocate("dgx0", ["GPU-nope"])
    with pytest.raises(UnknownNodeError):
        dgx1_cluster.allocate("nope", gpus)


def test_plan_then_apply_then_release_round_trip(dgx1_cluster: ClusterState) -> None:
    request = PlacementRequest(gpus=8)
    first = dgx1_cluster.place(request)
    assert first.placement is not None
    dgx1_cluster.apply(first.placement)
    second = dgx1_cluster.place(request)
    assert second.placement is not None
    assert second.placement.tasks[0].node != first.placement.tasks[0].node
    with pytest.raises(AllocationError):
        dgx1_cluster.apply(first.placement)  # a stale plan fails loudly
    dgx1_cluster.unapply(first.placement)
    again = dgx1_cluster.place(request)
    assert again == first


def test_snapshot_update_keeps_allocations_by_uuid(dgx1_cluster: ClusterState) -> None:
    gpus = uuids(dgx1_cluster, "dgx0", [0, 1, 2, 3])
    dgx1_cluster.allocate("dgx0", gpus)
    dgx1_cluster.upsert(build_profile("dgx1-v100", "dgx0", seq=5))
    assert dgx1_cluster.node("dgx0").held_gpus == set(gpus)
    assert dgx1_cluster.node("dgx0").free_mask.bit_count() == 4


def test_remove_and_readd_node() -> None:
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "a"))
    state.upsert(build_profile("hgx-h100", "b"))
    state.remove("a")
    assert state.names() == ["b"]
    state.upsert(build_profile("dgx1-v100", "c"))
    assert {_node(state, PlacementRequest(gpus=8, gpu_models=("V100",)))} == {"c"}
    assert len(state) == 2 and "a" not in state


def test_deterministic_for_the_same_input() -> None:
    def run() -> list[str]:
        state = ClusterState()
        for i, profile in enumerate(["dgx1-v100", "hgx-h100", "pcie-8x-l40s"] * 3):
            state.upsert(build_profile(profile, f"n{i}"))
        out = []
        for k in (1, 3, 2, 4, 1, 2, 8, 5):
            outcome = state.place(PlacementRequest(gpus=k))
            assert outcome.placement is not None
            state.apply(outcome.placement)
            out.append(outcome.placement.reason)
        return out

    assert run() == run()


def test_evaluate_ranks_fitting_nodes_and_explains_the_rest(dgx1_cluster: ClusterState) -> None:
    dgx1_cluster.allocate("dgx2", uuids(dgx1_cluster, "dgx2", list(range(6))))
    verdicts = dgx1_cluster.evaluate(
        PlacementRequest(gpus=4, nodes=("dgx0", "dgx1", "dgx2", "ghost"))
    )
    by_node = {v.node: v for v in verdicts}
    assert [v.node for v in verdicts if v.fits] == ["dgx0", "dgx1"]
    assert by_node["dgx0"].rank == 1 and by_node["dgx0"].task is not None
    assert by_node["dgx2"].cause is Cause.BUSY and by_node["dgx2"].resolvable
    assert by_node["ghost"].cause is Cause.NOT_REGISTERED
    assert 0 < by_node["dgx1"].score <= by_node["dgx0"].score <= 100


def test_cpus_come_from_the_gpus_numa_node() -> None:
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))
    outcome = state.place(PlacementRequest(gpus=4, cpus_per_task=8, numa="required"))
    assert outcome.placement is not None
    task = outcome.placement.tasks[0]
    assert task.numa_nodes == (0,) and task.cpus == tuple(range(8)) and task.cpuset == "0-7"
    state.apply(outcome.placement)
    second = state.place(PlacementRequest(gpus=4, cpus_per_task=8, numa="required"))
    assert second.placement is not None
    assert second.placement.tasks[0].numa_nodes == (1,)
    assert second.placement.tasks[0].cpuset == "48-55"


def test_numa_required_refuses_when_local_cpus_are_gone() -> None:
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))
    numa0 = state.node("h0").snapshot.numa_cpus(0)
    numa1 = state.node("h0").snapshot.numa_cpus(1)
    state.allocate("h0", cpus=numa0[:-2] + numa1[:-2])
    outcome = state.place(PlacementRequest(gpus=1, cpus_per_task=4, numa="required"))
    assert outcome.status == "unschedulable" and outcome.reasons[0].cause is Cause.CPUS
    relaxed = state.place(PlacementRequest(gpus=1, cpus_per_task=4, numa="preferred"))
    assert relaxed.placement is not None and len(relaxed.placement.tasks[0].cpus) == 4


def test_numa_required_takes_the_numa_node_that_has_the_cpus() -> None:
    # A 1-GPU task took every CPU of NUMA node 0 (GPUs 0-3); GPUs 1-3 stay free there.
    # The best 2-GPU set is then in NUMA node 0, which has no CPU left: the node was
    # refused for CPUs while NUMA node 1 had four GPUs and 40 CPUs free.
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "n1"))
    numa0 = state.node("n1").snapshot.numa_cpus(0)
    first = state.place(PlacementRequest(gpus=1, cpus_per_task=len(numa0), numa="required"))
    assert first.placement is not None and first.placement.tasks[0].numa_nodes == (0,)
    state.apply(first.placement)
    outcome = state.place(PlacementRequest(gpus=2, cpus_per_task=4, numa="required"))
    assert outcome.placement is not None, outcome.summary()
    task = outcome.placement.tasks[0]
    assert task.numa_nodes == (1,) and set(task.gpu_indices) <= {4, 5, 6, 7}
    assert len(task.cpus) == 4
    [verdict] = state.evaluate(PlacementRequest(gpus=2, cpus_per_task=4, numa="required"))
    assert verdict.fits and verdict.task is not None and verdict.task.numa_nodes == (1,)
    # Too many CPUs for either NUMA node's free ones: refused for CPUs, nothing else; and
    # more than either NUMA node has at all, so it never fits.
    refused = state.place(PlacementRequest(gpus=2, cpus_per_task=41, numa="required"))
    assert refused.status == "unresolvable" and refused.reasons[0].cause is Cause.CPUS
    assert refused.summary().startswith("no node has 41 CPUs on the NUMA node of 2 GPUs")


def test_a_verdict_built_for_one_cpu_count_is_not_the_answer_for_another() -> None:
    # Verdicts remember the task built per node for a request's shape; the CPUs asked
    # are not part of the shape, yet the task reserves them.
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "n1"))
    cpus = []
    for asked in (0, 4, 0, 6):
        [verdict] = state.evaluate(PlacementRequest(gpus=2, cpus_per_task=asked))
        assert verdict.task is not None
        cpus.append(len(verdict.task.cpus))
    assert cpus == [0, 4, 0, 6]


def test_balanced_packs_across_nodes_within_the_ring_budget() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "busy"))
    state.upsert(build_profile("dgx1-v100", "empty"))
    # busy keeps only an NV1 pair (0,1): 25 GB/s, half of the NV2 best.
    state.allocate("busy", uuids(state, "busy", [2, 3, 4, 5, 6, 7]))
    performance = state.place(PlacementRequest(gpus=2))
    balanced = state.place(PlacementRequest(gpus=2, objective="balanced", max_ring_loss=0.5))
    assert performance.placement and performance.placement.tasks[0].node == "empty"
    assert balanced.placement and balanced.placement.tasks[0].node == "busy"


def test_empty_cluster_is_unschedulable_not_unresolvable() -> None:
    outcome = ClusterState().place(PlacementRequest(gpus=1))
    assert outcome.status == "unschedulable"
    assert "no nodes" in outcome.summary()


def test_gpu_model_matches_whole_tokens_only() -> None:
    from placement.eligibility import model_matches_name

    assert model_matches_name("A100", "NVIDIA A100-SXM4-80GB")
    assert model_matches_name("h100", "NVIDIA H100 80GB HBM3")
    assert not model_matches_name("A10", "NVIDIA A100-SXM4-80GB")
    assert not model_matches_name("B200", "NVIDIA GB200")
    assert model_matches_name("V100M16", "V100M16")
    state = ClusterState()
    state.upsert(build_profile("dgx-a100", "a100"))
    outcome = state.place(PlacementRequest(gpus=1, gpu_models=("A10",)))
    assert outcome.status == "unresolvable"


def _rewired(name: str, k: int, seq: int) -> NodeSnapshot:
    """A 4-GPU node whose NVLink lane counts spell ``k``: a wiring of its own."""
    lanes = [1 + (k >> (3 * b) & 7) for b in range(3)]
    links = [["X" if i == j else "SYS" for j in range(4)] for i in range(4)]
    for b, (i, j) in enumerate(((0, 1), (1, 2), (2, 3))):
        links[i][j] = links[j][i] = f"NV{lanes[b]}"
    gpus = [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "x"} for i in range(4)]
    return NodeSnapshot(name=name, gpus=gpus, links=links, seq=seq)


def test_classes_no_node_has_any_more_are_given_back() -> None:
    """Each class costs its subset tables (about 5 MB for 16 GPUs) and was kept for good:
    a node reporting a new wiring with every snapshot grew every replica's memory
    without bound. Classes no node uses go once they outnumber the ones in use."""
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "dgx0"))
    before = state.place(PlacementRequest(gpus=4))
    for seq in range(200):
        state.upsert(_rewired("churn", seq, seq))
        assert state.class_count <= 2 * 32 + 2
    assert state.topology_class("churn").n == 4
    state.allocate("churn", {"GPU-churn-0", "GPU-churn-1"})
    after = state.place(PlacementRequest(gpus=4))
    assert after.placement is not None and before.placement is not None
    assert after.placement.tasks == before.placement.tasks  # dgx0's answers unchanged
    two = state.place(PlacementRequest(gpus=2, nodes=["churn"]))
    assert two.placement is not None and two.placement.tasks[0].gpu_indices == (2, 3)
    fresh = ClusterState()
    fresh.upsert(build_profile("dgx1-v100", "dgx0"))
    fresh.upsert(state.node("churn").snapshot)
    fresh.allocate("churn", {"GPU-churn-0", "GPU-churn-1"})
    for gpus in (1, 2, 3, 4, 8):
        request = PlacementRequest(gpus=gpus, policy="pack")
        assert state.place(request) == fresh.place(request)
