"""Gangs: all or nothing, one NVLink domain first, then the fewest network blocks."""

from __future__ import annotations

import pytest

from placement import Cause, ClusterState, PlacementRequest
from placement.gang import _NodeSets
from placement.profiles import build_profile, gb200_nvl72_rack
from tests.placement.conftest import dgx1_nodes


def _rack_cluster() -> ClusterState:
    state = ClusterState()
    for snap in gb200_nvl72_rack("rack-a", clique_id=1):
        state.upsert(snap)
    for snap in gb200_nvl72_rack("rack-b", clique_id=2)[:8]:  # a partial rack: 8 trays
        state.upsert(snap)
    return state


def test_gang_lands_in_one_clique_tightest_fit() -> None:
    state = _rack_cluster()
    outcome = state.place(PlacementRequest(gpus=4, tasks=6, locality="nvlink"))
    assert outcome.placement is not None
    nodes = outcome.placement.nodes
    assert len(nodes) == 6 and all(n.startswith("rack-b") for n in nodes)
    assert outcome.placement.fabric_domain is not None
    assert outcome.placement.ring_gbps == 900.0


def test_gang_too_big_for_any_clique_uses_fewest_blocks() -> None:
    state = _rack_cluster()
    outcome = state.place(PlacementRequest(gpus=4, tasks=20))
    assert outcome.placement is not None
    assert outcome.placement.fabric_domain is None
    assert set(outcome.placement.network_blocks) == {
        "topoplace.io/rack=rack-a",
        "topoplace.io/rack=rack-b",
    }
    # across blocks the gang is limited by the network between them
    assert outcome.placement.ring_gbps == state.bandwidth.cross_block_gbps


def test_gang_is_all_or_nothing() -> None:
    state = _rack_cluster()
    # 26 trays of 4 GPUs; one tray busy, so a gang of 26 fits the idle cluster but not now.
    busy = next(state.nodes())
    state.allocate(busy.name, [g.uuid for g in busy.snapshot.gpus])
    outcome = state.place(PlacementRequest(gpus=4, tasks=26))
    assert outcome.status == "unschedulable"
    assert outcome.reasons[0].cause is Cause.GANG
    assert "25 of 26 tasks" in outcome.reasons[0].message
    assert [n.name for n in state.nodes() if n.held_gpus] == [busy.name]


def test_gang_tasks_share_a_node_when_it_has_room() -> None:
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))
    state.upsert(build_profile("hgx-h100", "h1"))
    outcome = state.place(PlacementRequest(gpus=4, tasks=2))
    assert outcome.placement is not None
    assert outcome.placement.nodes == ("h0",)
    a, b = outcome.placement.tasks
    assert not set(a.gpu_indices) & set(b.gpu_indices)
    assert outcome.placement.ring_gbps == 450.0


def test_waiting_gang_keeps_its_clique_whole() -> None:
    state = ClusterState()
    for snap in gb200_nvl72_rack("rack-a", clique_id=1)[:4]:
        state.upsert(snap)
    state.upsert(build_profile("hgx-b200", "solo"))
    waiting = [PlacementRequest(gpus=4, tasks=4, locality="nvlink")]
    single = PlacementRequest(gpus=4, policy="pack")
    free = state.place(single)
    assert free.placement is not None and free.placement.tasks[0].node.startswith("rack-a")
    guarded = state.place(single, waiting=waiting)
    assert guarded.placement is not None and guarded.placement.tasks[0].node == "solo"


def test_gang_ring_inside_one_node_uses_the_union_of_its_sets() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "d0"))
    outcome = state.place(PlacementRequest(gpus=2, tasks=4))
    assert outcome.placement is not None and outcome.placement.nodes == ("d0",)
    assert outcome.placement.ring_gbps == 50.0  # all 8 GPUs: the NV2 ring of the cube-mesh


def test_gang_over_many_blocks_is_grouped_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    # Nodes without a block label are blocks of their own, so a gang of one task per node
    # takes every block, largest first. The grouping once summed every chosen node's
    # capacity again per block taken: N^2/2 reads for N blocks (775 ms of the event loop
    # for 4,090 nodes). Counting the reads states the bound without timing anything.
    state = ClusterState()
    nodes = 240
    for i in range(nodes):
        state.upsert(build_profile("riscv-nvlfusion-4", f"r{i:03d}"))
    reads = 0
    original: property = vars(_NodeSets)["capacity"]

    def counted(self: _NodeSets) -> int:
        nonlocal reads
        reads += 1
        value: int = original.__get__(self)
        return value

    monkeypatch.setattr(_NodeSets, "capacity", property(counted))
    outcome = state.place(PlacementRequest(gpus=4, tasks=nodes))
    assert outcome.placement is not None
    assert len(outcome.placement.network_blocks) == nodes
    assert reads <= 8 * nodes

    # One GPU busy: every block is taken and the gang still does not fit.
    busy = state.node("r000").snapshot.gpus[0].uuid
    state.allocate("r000", [busy])
    reads = 0
    refused = state.place(PlacementRequest(gpus=4, tasks=nodes))
    assert refused.status == "unschedulable"
    assert reads <= 8 * nodes


def test_gang_scores_only_the_sets_it_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    # Capacity plans every set each node could give (8 per 8-GPU node for 1-GPU tasks),
    # but only the sets the gang takes become tasks. Building the score of every planned
    # set was most of a 4,096-task gang's decision over 10,000 nodes (78,000 scores for
    # 4,096 tasks, about a second under the state lock); counting them bounds the work.
    from placement import gang

    state = ClusterState()
    for i in range(16):
        state.upsert(build_profile("hgx-h100", f"h{i:02d}"))
    built = 0
    original = gang.score_parts

    def counted(*args: object) -> object:
        nonlocal built
        built += 1
        return original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(gang, "score_parts", counted)
    outcome = state.place(PlacementRequest(gpus=1, tasks=4, locality="any"))
    assert outcome.placement is not None and len(outcome.placement.tasks) == 4
    assert built <= 4


def test_gang_tasks_on_one_node_do_not_count_the_same_numa_cpus_twice() -> None:
    # Each NUMA node has the CPUs of one task. The first task takes NUMA node 0's CPUs;
    # the second was planned beside them (the NUMA rule saw NUMA node 0's CPUs free), its
    # CPUs were then missing and the gang was refused while NUMA node 1 had GPUs and CPUs.
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))
    snap = state.node("h0").snapshot
    per_numa = len(snap.numa_cpus(0))
    for gpus in (1, 2):
        request = PlacementRequest(gpus=gpus, tasks=2, cpus_per_task=per_numa, numa="required")
        outcome = state.place(request)
        assert outcome.placement is not None, outcome.summary()
        a, b = outcome.placement.tasks
        assert {a.numa_nodes, b.numa_nodes} == {(0,), (1,)}
        assert not set(a.cpus) & set(b.cpus)
    # Three such tasks cannot fit the node, even idle.
    refused = state.place(
        PlacementRequest(gpus=1, tasks=3, cpus_per_task=per_numa, numa="required")
    )
    assert refused.status == "unresolvable"
    assert "at most 2 tasks" in refused.summary()


def test_gang_capacity_counts_the_cpus_its_earlier_tasks_take() -> None:
    # Spilling NUMA rule: a node with the CPUs of one task offered two (its GPUs had
    # room), the gang chose that node alone and was refused for CPUs although one task on
    # each node fits.
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))
    state.upsert(build_profile("hgx-h100", "h1"))
    total = sum(len(state.node("h0").snapshot.numa_cpus(n)) for n in (0, 1))
    outcome = state.place(PlacementRequest(gpus=1, tasks=2, cpus_per_task=total - 8))
    assert outcome.placement is not None, outcome.summary()
    assert sorted(outcome.placement.nodes) == ["h0", "h1"]


def test_gang_refused_for_cpus_says_so() -> None:
    # A node whose free CPUs hold no task is refused for CPUs, not left out unexplained.
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))
    snap = state.node("h0").snapshot
    state.allocate("h0", cpus=(snap.numa_cpus(0) + snap.numa_cpus(1))[:-10])
    outcome = state.place(PlacementRequest(gpus=1, tasks=2, cpus_per_task=20))
    assert outcome.status == "unschedulable"
    assert [r.cause for r in outcome.reasons] == [Cause.CPUS]


def test_a_gang_refusal_speaks_of_one_node_as_one() -> None:
    state = dgx1_nodes("a", "b")
    state.allocate("b", [g.uuid for g in state.node("b").snapshot.gpus])
    outcome = state.place(PlacementRequest(gpus=8, tasks=2))
    assert outcome.summary().startswith("1 node: it holds only 1 of 2 tasks of 8 GPUs")
    state.release("b", [g.uuid for g in state.node("b").snapshot.gpus])
    state.upsert(build_profile("dgx1-v100", "c"))
    state.allocate("c", [g.uuid for g in state.node("c").snapshot.gpus][:4])
    wide = state.place(PlacementRequest(gpus=8, tasks=3))
    assert "2 nodes: together they hold only 2 of 3 tasks of 8 GPUs" in wide.summary()
