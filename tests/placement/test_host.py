"""Host CPU and memory per task: the node filter, use through apply/unapply, stranded GPUs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from placement import ClusterState, PlacementRequest
from placement.outcome import Cause
from placement.profiles import build_profile
from tests.placement.conftest import dgx1_nodes as cluster
from tests.placement.conftest import place_applied as place


def hold(state: ClusterState, node: str, gpus: int, cpu_milli: int) -> None:
    uuids = [g.uuid for g in state.node(node).snapshot.gpus[:gpus]]
    state.allocate(node, uuids, cpu_milli=cpu_milli)


def test_capacity_comes_from_the_snapshot_unless_set() -> None:
    state = cluster("a")
    snap = state.node("a").snapshot
    cpus = len({c for numa in snap.numa_nodes for c in numa.cpu_list})
    memory = sum(numa.memory_mib for numa in snap.numa_nodes)
    assert state.host_room("a") == (cpus * 1000, memory or None)
    state.set_host_capacity("a", 8000, None)  # None: not known, so unlimited
    assert state.host_room("a") == (8000, None)


def test_a_node_without_the_host_room_is_not_a_candidate() -> None:
    state = cluster("a", "b")
    state.set_host_capacity("a", 8000, 65536)
    state.set_host_capacity("b", 64000, 65536)
    assert place(state, PlacementRequest(cpu_milli=10000))[0] == "b"
    # Either node holds it (where is the ranking's business); that node then holds
    # 60000 MiB of its 65536, so a task of 8000 MiB fits only on the other
    full = place(state, PlacementRequest(memory_mib=60000))[0]
    assert place(state, PlacementRequest(memory_mib=8000))[0] == {"a": "b", "b": "a"}[full]
    refused = state.place(PlacementRequest(cpu_milli=60_000))
    assert refused.placement is None
    assert [r.cause for r in refused.reasons] == [Cause.HOST]
    assert refused.status == "unschedulable"  # host room may come back: resolvable


@pytest.mark.parametrize("tasks", [1, 2])
def test_more_host_room_than_any_node_has_is_unresolvable(tasks: int) -> None:
    """Room taken comes back as tasks end; a node never grows. A task asking more CPU or
    memory than every node has was refused as unschedulable: a scheduler waited for
    ever on an idle cluster."""
    state = cluster("a", "b")
    state.set_host_capacity("a", 8000, 65536)
    state.set_host_capacity("b", 64000, 131072)
    refused = state.place(PlacementRequest(cpu_milli=100_000, tasks=tasks))
    assert refused.status == "unresolvable"
    assert refused.summary() == (
        "no node has 100000 milli-CPUs of host CPU (cpu_milli); the largest has 64000"
    )
    memory = state.place(PlacementRequest(memory_mib=200_000, tasks=tasks))
    assert memory.status == "unresolvable"
    assert memory.summary() == (
        "no node has 200000 MiB of host memory (memory_mib); the largest has 131072"
    )
    # A node whose capacity is not known may hold it: never "never".
    state.set_host_capacity("a", None, None)
    assert state.place(PlacementRequest(cpu_milli=100_000, gpus=8)).placed


def test_unknown_capacity_is_never_short() -> None:
    state = cluster("a")
    state.set_host_capacity("a", 0, 0)  # 0 is a known capacity: nothing fits
    assert state.place(PlacementRequest(cpu_milli=1)).placement is None
    other = ClusterState()
    bare = build_profile("dgx1-v100", "n").model_copy(update={"numa_nodes": ()})
    other.upsert(bare)
    assert other.host_room("n") == (None, None)
    assert place(other, PlacementRequest(cpu_milli=10**9, memory_mib=10**9))[0] == "n"


def test_apply_and_unapply_count_host_use() -> None:
    state = cluster("a")
    outcome = state.place(PlacementRequest(gpus=2, cpu_milli=3000, memory_mib=4096))
    assert outcome.placement is not None
    task = outcome.placement.tasks[0]
    assert (task.cpu_milli, task.memory_mib) == (3000, 4096)
    state.apply(outcome.placement)
    assert state.host_used("a") == (3000, 4096)
    state.unapply(outcome.placement)
    assert state.host_used("a") == (0, 0)
    state.unapply(outcome.placement)  # a release the counts never saw makes no room
    assert state.host_used("a") == (0, 0)


def test_shares_count_host_use_and_skip_nodes_without_room() -> None:
    state = cluster("a", "b")
    state.set_host_capacity("a", 10000, None)
    state.set_host_capacity("b", None, None)
    first = place(state, PlacementRequest(gpu_fraction=0.5, cpu_milli=8000))
    assert first[0] == "a"
    assert state.host_used("a") == (8000, 0)
    # a's shared GPU has room, but not a's CPU: the share goes to b
    assert place(state, PlacementRequest(gpu_fraction=0.25, cpu_milli=4000))[0] == "b"


def test_the_host_term_keeps_gpus_usable() -> None:
    # 10 CPUs per GPU. a: 4 GPUs free with 40 CPUs; b: 4 GPUs free with 70 CPUs.
    # A 1-GPU task of 30 CPUs leaves a with 3 GPUs and 10 CPUs (2 GPUs stranded) and
    # b with 3 GPUs and 40 CPUs (none): equal for packing, so without host figures the
    # node added first (a) wins; with them, b.
    state = cluster("a", "b", host_mix=(10000.0, 0.0))
    state.set_host_capacity("a", 80000, None)
    state.set_host_capacity("b", 80000, None)
    hold(state, "a", 4, 40000)
    hold(state, "b", 4, 10000)
    assert state.place(PlacementRequest()).placement.tasks[0].node == "a"  # type: ignore[union-attr]
    assert place(state, PlacementRequest(cpu_milli=30000))[0] == "b"


def test_packing_still_wins_where_nothing_is_stranded() -> None:
    state = cluster("a", "b", host_mix=(10000.0, 0.0))
    hold(state, "b", 6, 10000)
    assert place(state, PlacementRequest(cpu_milli=5000))[0] == "b"


def test_the_mix_is_observed_from_applied_tasks() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "a"))
    place(state, PlacementRequest(gpus=2, cpu_milli=8000, memory_mib=1000))
    place(state, PlacementRequest(gpu_fraction=0.5, cpu_milli=1000))
    assert state._table.host_mix.per_gpu() == (9000 / 2.5, 1000 / 2.5)


def test_requests_without_figures_ignore_host_use() -> None:
    state = cluster("a")
    state.set_host_capacity("a", 1000, 1000)
    hold(state, "a", 1, 1000)
    assert place(state, PlacementRequest(gpus=2))[0] == "a"


@pytest.mark.parametrize("field", ["cpu_milli", "memory_mib"])
@pytest.mark.parametrize("value", [-1, 1.5, "10", True])
def test_bad_host_figures_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        PlacementRequest.model_validate({field: value})


def test_a_gangs_tasks_on_one_node_are_summed() -> None:
    state = cluster("a", "b")
    state.set_host_capacity("a", 20000, None)
    state.set_host_capacity("b", 20000, None)
    outcome = state.place(PlacementRequest(gpus=1, tasks=4, cpu_milli=8000))
    assert outcome.placement is not None
    per_node = [t.node for t in outcome.placement.tasks]
    assert sorted(per_node) == ["a", "a", "b", "b"]  # 2 x 8000 fit in 20000, 3 do not
    state.apply(outcome.placement)
    assert state.host_used("a") == state.host_used("b") == (16000, 0)
    assert state.place(PlacementRequest(gpus=1, tasks=3, cpu_milli=8000)).placement is None


def test_host_use_without_gpus_is_counted_but_not_in_the_mix() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "a"))
    state.allocate("a", cpu_milli=4000, memory_mib=100)
    assert state.host_used("a") == (4000, 100)
    assert state._table.host_mix.per_gpu() == (0.0, 0.0)
    state.release("a", cpu_milli=4000, memory_mib=100)
    assert state.host_used("a") == (0, 0)
