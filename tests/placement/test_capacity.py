"""Unresolvable versus unschedulable, decided from what the cluster could ever hold.

Cordoned and stale nodes and busy GPUs are capacity that may come back
(unschedulable: retry); an unknown named node, or more than the nodes could
hold idle, is not (unresolvable: change the request).
"""

from __future__ import annotations

import random

import pytest

from placement import Cause, ClusterState, PlacementRequest
from placement.profiles import build_profile
from tests.placement.conftest import uuids


def _cluster_of_76() -> ClusterState:
    """9 HGX H100 (8 GPUs, 192 CPUs) and one 4-GPU RISC-V node: 76 GPUs."""
    state = ClusterState()
    for i in range(9):
        state.upsert(build_profile("hgx-h100", f"h{i}"))
    state.upsert(build_profile("riscv-nvlfusion-4", "r0"))
    return state


def test_gang_larger_than_the_cluster_is_unresolvable() -> None:
    outcome = _cluster_of_76().place(PlacementRequest(gpus=8, tasks=1000))
    assert outcome.status == "unresolvable"
    assert outcome.summary() == "the cluster has 76 GPUs in all; this gang needs 8000"
    assert outcome.reasons[0].cause is Cause.GANG  # what the nodes hold now stays in the detail


def test_gang_that_fits_only_with_cordoned_or_stale_nodes_is_unschedulable() -> None:
    state = _cluster_of_76()
    state.set_available("h0", False)  # cordoned (the engine sees stale nodes the same way)
    state.set_available("h1", False)
    outcome = state.place(PlacementRequest(gpus=8, tasks=9))
    assert outcome.status == "unschedulable"
    assert (Cause.UNAVAILABLE, 2) in [(g.cause, g.nodes) for g in outcome.reasons]
    assert state.place(PlacementRequest(gpus=8, tasks=10)).status == "unresolvable"


def test_gang_whose_sets_cannot_add_up_says_how_many_tasks_fit() -> None:
    state = ClusterState()
    for i in range(3):
        state.upsert(build_profile("dgx1-v100", f"dgx{i}"))
    # 24 GPUs, 21 needed, but an 8-GPU node gives only two sets of 3.
    outcome = state.place(PlacementRequest(gpus=3, tasks=7))
    assert outcome.status == "unresolvable"
    assert outcome.summary() == (
        "the cluster holds at most 6 tasks of 3 GPUs even when idle; this gang needs 7"
    )
    assert state.place(PlacementRequest(gpus=3, tasks=6)).placed


def test_gang_of_busy_gpus_is_unschedulable() -> None:
    state = ClusterState()
    for i in range(3):
        state.upsert(build_profile("dgx1-v100", f"dgx{i}"))
    state.allocate("dgx0", uuids(state, "dgx0", [0]))
    outcome = state.place(PlacementRequest(gpus=8, tasks=3))
    assert outcome.status == "unschedulable"
    assert outcome.reasons[0].cause is Cause.GANG


def test_more_cpus_per_task_than_any_node_has_is_unresolvable() -> None:
    state = ClusterState()
    for i in range(3):
        state.upsert(build_profile("hgx-b200", f"b{i}"))  # 224 CPUs each
    state.set_available("b2", False)  # cordoned, and still too small
    outcome = state.place(PlacementRequest(gpus=1, cpus_per_task=4096))
    assert outcome.status == "unresolvable"
    assert outcome.summary() == "no node has 4096 CPUs; the largest has 224"
    assert [(g.cause, g.nodes) for g in outcome.reasons] == [(Cause.TOO_FEW_CPUS, 3)]
    gang = state.place(PlacementRequest(gpus=1, tasks=2, cpus_per_task=4096))
    assert gang.status == "unresolvable" and gang.summary() == outcome.summary()


def test_cpus_a_cordoned_node_has_are_capacity_that_may_come_back() -> None:
    state = ClusterState()
    state.upsert(build_profile("hgx-b200", "b0"))  # 224 CPUs
    state.upsert(build_profile("dgx1-v100", "v0"))  # 80 CPUs
    state.set_available("b0", False)
    outcome = state.place(PlacementRequest(gpus=1, cpus_per_task=200))
    assert outcome.status == "unschedulable"
    assert {(g.cause, g.nodes) for g in outcome.reasons} == {
        (Cause.UNAVAILABLE, 1),
        (Cause.TOO_FEW_CPUS, 1),
    }
    # Two tasks of 200 CPUs never fit one 224-CPU node, and the other is too small.
    assert state.place(PlacementRequest(gpus=1, tasks=2, cpus_per_task=200)).status == (
        "unresolvable"
    )


def test_only_unknown_named_nodes_is_unresolvable() -> None:
    state = _cluster_of_76()
    outcome = state.place(PlacementRequest(gpus=1, nodes=("ghost",)))
    assert outcome.status == "unresolvable"
    assert outcome.summary() == "no topoplace agent has reported a node named ghost"
    assert [(g.cause, g.nodes, g.resolvable) for g in outcome.reasons] == [
        (Cause.NOT_REGISTERED, 1, False)
    ]
    gang = state.place(PlacementRequest(gpus=1, tasks=2, nodes=("ghost", "spook")))
    assert gang.status == "unresolvable"
    assert "any of the 2 named nodes (ghost, spook)" in gang.summary()
    mig = state.place(PlacementRequest(mig_profile="1g.10gb", nodes=("ghost",)))
    assert mig.status == "unresolvable"


def test_an_unknown_name_beside_a_cordoned_node_is_unschedulable() -> None:
    state = _cluster_of_76()
    state.set_available("h0", False)
    outcome = state.place(PlacementRequest(gpus=1, nodes=("ghost", "h0")))
    assert outcome.status == "unschedulable"
    assert {(g.cause, g.nodes) for g in outcome.reasons} == {
        (Cause.NOT_REGISTERED, 1),
        (Cause.UNAVAILABLE, 1),
    }


def test_sixteen_gpus_on_8_gpu_nodes_says_no_node_has_them() -> None:
    state = ClusterState()
    for i in range(3):
        state.upsert(build_profile("dgx1-v100", f"dgx{i}"))
    for request in (PlacementRequest(gpus=16), PlacementRequest(gpus=16, tasks=2)):
        outcome = state.place(request)
        assert outcome.status == "unresolvable"
        assert outcome.summary() == "no node has 16 GPUs; the largest has 8"
    named = state.place(PlacementRequest(gpus=16, nodes=("dgx0", "dgx1")))
    assert named.summary() == "no named node has 16 GPUs; the largest has 8"


def test_a_partly_mig_node_counts_its_whole_gpus() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx-a100-mig", "a0"))  # 8 GPUs, 4 of them in MIG mode
    outcome = state.place(PlacementRequest(gpus=8))
    assert outcome.status == "unresolvable"
    assert outcome.summary() == (
        "no node has 8 whole GPUs; the largest has 4"
        " (GPUs in MIG mode are given only as MIG instances)"
    )


def test_a_gpu_model_no_node_has_is_unresolvable() -> None:
    outcome = _cluster_of_76().place(PlacementRequest(gpus=2, gpu_models=("A100",)))
    assert outcome.status == "unresolvable"
    assert outcome.summary() == "no node has a GPU of model A100"
    memory = _cluster_of_76().place(PlacementRequest(gpus=1, min_gpu_memory_mib=10**7))
    assert memory.summary() == "no node has a GPU with at least 10000000 MiB"


def test_more_mig_tasks_than_instances_is_unresolvable() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx-a100-mig", "m0"))  # nine 1g.10gb instances
    state.set_available("m0", False)
    assert state.place(PlacementRequest(mig_profile="1g.10gb", tasks=9)).status == "unschedulable"
    outcome = state.place(PlacementRequest(mig_profile="1g.10gb", tasks=10))
    assert outcome.status == "unresolvable"
    assert outcome.summary() == (
        "the cluster has 9 MIG instances of profile 1g.10gb in all; this request needs 10"
    )


def test_a_request_that_leaves_no_node_is_unresolvable_an_empty_cluster_is_not() -> None:
    state = _cluster_of_76()
    assert state.place(PlacementRequest(gpus=1, nodes=())).status == "unresolvable"
    every = tuple(state.names())
    assert state.place(PlacementRequest(gpus=1, exclude_nodes=every)).status == "unresolvable"
    empty = ClusterState().place(PlacementRequest(gpus=8, tasks=1000))
    assert empty.status == "unschedulable" and "no nodes registered yet" in empty.summary()


def test_node_verdicts_say_unknown_and_too_small_nodes_never_fit() -> None:
    state = _cluster_of_76()
    verdicts = {v.node: v for v in state.evaluate(PlacementRequest(gpus=1, nodes=("h0", "x")))}
    assert verdicts["x"].cause is Cause.NOT_REGISTERED and not verdicts["x"].resolvable
    screen = state.screen(PlacementRequest(gpus=1, cpus_per_task=4096))
    assert not screen.fits.any() and {screen.cause(i) for i in range(10)} == {Cause.TOO_FEW_CPUS}


REQUESTS = (
    PlacementRequest(gpus=8),
    PlacementRequest(gpus=16),
    PlacementRequest(gpus=4, locality="nvlink"),
    PlacementRequest(gpus=2, cpus_per_task=150),
    PlacementRequest(gpus=1, cpus_per_task=300),
    PlacementRequest(gpus=8, tasks=3),
    PlacementRequest(gpus=8, tasks=4),
    PlacementRequest(gpus=3, tasks=5),
    PlacementRequest(gpus=4, tasks=3, cpus_per_task=100),
    PlacementRequest(gpus=2, tasks=9, locality="nvlink"),
    PlacementRequest(gpus=1, nodes=("v0", "ghost")),
    PlacementRequest(gpus=8, tasks=2, nodes=("v0", "ghost")),
    PlacementRequest(mig_profile="1g.10gb", tasks=9),
    PlacementRequest(mig_profile="1g.10gb", tasks=10),
    PlacementRequest(gpus=2, cpus_per_task=40, numa="required"),
    PlacementRequest(gpus=2, cpus_per_task=41, numa="required"),
    PlacementRequest(gpus=1, tasks=5, cpus_per_task=40, numa="required"),
    PlacementRequest(mig_profile="1g.10gb", gpu_models=("H100",)),
    PlacementRequest(mig_profile="1g.10gb", tasks=2, cpus_per_task=32, numa="required"),
    PlacementRequest(mig_profile="1g.10gb", tasks=3, cpus_per_task=32, numa="required"),
    PlacementRequest(mig_profile="1g.10gb", cpus_per_task=33, numa="required"),
    PlacementRequest(mig_profile="1g.10gb", tasks=2, cpus_per_task=128),
    PlacementRequest(mig_profile="1g.10gb", tasks=3, cpus_per_task=128),
)


@pytest.mark.parametrize("seed", range(6))
def test_unresolvable_exactly_when_the_idle_cluster_would_refuse(seed: int) -> None:
    profiles = (("dgx1-v100", "v0"), ("hgx-b200", "b0"), ("dgx-a100-mig", "m0"))
    idle, live = ClusterState(), ClusterState()
    for profile, name in profiles:
        idle.upsert(build_profile(profile, name))
        live.upsert(build_profile(profile, name))
    rng = random.Random(seed)
    for name in live.names():
        if rng.random() < 0.4:
            live.set_available(name, False)
        entry = live.node(name)
        free = [g.index for g in entry.snapshot.gpus if not g.mig_enabled]
        live.allocate(name, uuids(live, name, rng.sample(free, rng.randint(0, len(free)))))
    for request in REQUESTS:
        never = not idle.place(request).placed
        outcome = live.place(request)
        if outcome.placed:
            assert not never, request
            continue
        assert (outcome.status == "unresolvable") == never, (request, outcome.summary())


def test_more_cpus_than_any_numa_node_has_under_numa_required_is_unresolvable() -> None:
    # numa="required" takes a task's CPUs from its GPUs' NUMA node alone. An idle node
    # whose NUMA nodes have 96 CPUs each never gives 120 (nor three tasks of 64, one per
    # NUMA node at most): the refusal was unschedulable (409, "retry"), and a scheduler
    # kept waiting for what never comes.
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))  # 2 NUMA nodes of 96 CPUs, 4 GPUs each
    outcome = state.place(PlacementRequest(gpus=1, cpus_per_task=120, numa="required"))
    assert outcome.status == "unresolvable", outcome.summary()
    assert outcome.summary() == (
        "no node has 120 CPUs on the NUMA node of 1 GPU (numa required); the most is 96"
    )
    gang = state.place(PlacementRequest(gpus=1, tasks=3, cpus_per_task=64, numa="required"))
    assert gang.status == "unresolvable", gang.summary()
    assert "at most 2 tasks" in gang.summary()
    # What spills to another NUMA node still fits, and so does one per NUMA node.
    assert state.place(PlacementRequest(gpus=1, tasks=3, cpus_per_task=64)).placement
    two = PlacementRequest(gpus=1, tasks=2, cpus_per_task=96, numa="required")
    assert state.place(two).placement is not None


def test_mig_tasks_past_what_the_instances_cpus_allow_are_unresolvable() -> None:
    # MIG tasks reserve CPUs near their GPU: 1g.10gb instances sit on GPUs 0 and 1 (NUMA
    # node 3) and GPU 3 (NUMA node 1), NUMA nodes of 32 CPUs. What their CPUs can never
    # give was unschedulable, counted as if CPUs were no matter.
    state = ClusterState()
    state.upsert(build_profile("dgx-a100-mig", "m0"))
    wide = state.place(PlacementRequest(mig_profile="1g.10gb", numa="required", cpus_per_task=33))
    assert wide.status == "unresolvable"
    assert wide.summary() == (
        "no node has 33 CPUs on the NUMA node of a MIG instance of profile 1g.10gb"
        " (numa required); the most is 32"
    )
    three = state.place(
        PlacementRequest(mig_profile="1g.10gb", numa="required", tasks=3, cpus_per_task=32)
    )
    assert three.status == "unresolvable"
    assert three.summary() == (
        "the cluster holds at most 2 MIG instances of profile 1g.10gb (on one NUMA node,"
        " with 32 CPUs each) even when idle; this request needs 3"
    )
    h100 = state.place(PlacementRequest(mig_profile="1g.10gb", gpu_models=("H100",)))
    assert h100.summary() == "no node has a MIG instance of profile 1g.10gb of model H100"
