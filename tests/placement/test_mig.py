"""MIG: one instance per task, largest free slice runs kept whole."""

from __future__ import annotations

import pytest

from placement import AllocationError, Cause, ClusterState, PlacementRequest
from placement.profiles import build_profile


def _state() -> ClusterState:
    state = ClusterState()
    state.upsert(build_profile("dgx-a100-mig", "mig0"))
    return state


def test_mig_request_gets_an_instance_of_that_profile() -> None:
    state = _state()
    outcome = state.place(PlacementRequest(mig_profile="2g.20gb"))
    assert outcome.placement is not None
    task = outcome.placement.tasks[0]
    snap = state.node("mig0").snapshot
    inst = next(i for i in snap.mig_instances if i.uuid == task.mig_uuids[0])
    assert inst.profile == "2g.20gb" and task.gpu_indices == (inst.parent_gpu,)


def test_small_instance_goes_where_it_breaks_no_large_run() -> None:
    state = _state()
    snap = state.node("mig0").snapshot
    # GPU 1 has 3x 2g.20gb + 1g.10gb@6; GPU 3 has 4g@0, 2g@4, 1g@6: taking a
    # 1g at slice 6 leaves runs of 6 slices on GPU 1 or 3, while GPU 0's
    # seven 1g instances would lose the middle of its run. The engine must
    # not take a 1g from the middle of a run.
    outcome = state.place(PlacementRequest(mig_profile="1g.10gb"))
    assert outcome.placement is not None
    inst = next(i for i in snap.mig_instances if i.uuid == outcome.placement.tasks[0].mig_uuids[0])
    assert inst.placement_start in (0, 6)


def test_mig_instances_are_not_given_twice_and_run_out() -> None:
    state = _state()
    given: set[str] = set()
    for _ in range(2):
        outcome = state.place(PlacementRequest(mig_profile="3g.40gb"))
        assert outcome.placement is not None
        state.apply(outcome.placement)
        given |= set(outcome.placement.tasks[0].mig_uuids)
    assert len(given) == 2
    outcome = state.place(PlacementRequest(mig_profile="3g.40gb"))
    assert outcome.status == "unschedulable"
    assert outcome.reasons[0].cause is Cause.NO_FREE_MIG


def test_unknown_profile_is_unresolvable() -> None:
    outcome = _state().place(PlacementRequest(mig_profile="7g.80gb"))
    assert outcome.status == "unresolvable"
    assert outcome.reasons[0].cause is Cause.NO_MIG_PROFILE


def test_mig_gpus_are_not_given_as_whole_gpus() -> None:
    state = _state()
    outcome = state.place(PlacementRequest(gpus=4))
    assert outcome.placement is not None
    assert set(outcome.placement.tasks[0].gpu_indices) <= {4, 5, 6, 7}
    assert state.place(PlacementRequest(gpus=5)).status == "unresolvable"


def test_mig_gang_is_all_or_nothing() -> None:
    state = _state()
    # Two 3g.40gb instances on the node: with one taken, a gang of two waits for it.
    taken = state.place(PlacementRequest(mig_profile="3g.40gb"))
    assert taken.placement is not None
    state.apply(taken.placement)
    outcome = state.place(PlacementRequest(mig_profile="3g.40gb", tasks=2))
    assert outcome.status == "unschedulable"
    assert state.node("mig0").held_migs == set(taken.placement.tasks[0].mig_uuids)
    ok = state.place(PlacementRequest(mig_profile="1g.10gb", tasks=9))
    assert ok.placement is not None and len({t.mig_uuids[0] for t in ok.placement.tasks}) == 9


def test_mig_verdicts() -> None:
    state = _state()
    state.upsert(build_profile("hgx-h100", "plain"))
    verdicts = state.evaluate(PlacementRequest(mig_profile="1g.10gb"))
    by_node = {v.node: v for v in verdicts}
    assert by_node["mig0"].fits and by_node["mig0"].rank == 1
    assert by_node["plain"].cause is Cause.NO_MIG_PROFILE and not by_node["plain"].resolvable


def test_no_instance_of_a_gpu_held_whole_or_in_shares_when_it_turns_mig() -> None:
    """A GPU held by a whole-GPU job, and one holding shares, are reported in MIG mode
    later (the jobs still run): none of their instances is given to a MIG request."""
    snap = build_profile("dgx-a100-mig", "mig0")
    plain = snap.model_copy(
        update={
            "gpus": [g.model_copy(update={"mig_enabled": False}) for g in snap.gpus],
            "mig_instances": [],
        }
    )
    state = ClusterState()
    state.upsert(plain)
    whole, shared = snap.gpus[0].uuid, snap.gpus[1].uuid
    state.allocate("mig0", [whole])
    state.allocate_share("mig0", shared, 0.25)
    state.upsert(snap.model_copy(update={"seq": 1}))
    parents: set[int] = set()
    while (placement := state.place(PlacementRequest(mig_profile="1g.10gb")).placement) is not None:
        state.apply(placement)
        parents |= set(placement.tasks[0].gpu_indices)
    assert parents and not parents & {0, 1}


def test_a_gpu_with_a_held_instance_is_not_free_when_it_turns_mig_off() -> None:
    """A GPU one of whose MIG instances a job holds is reported with MIG off (its
    instances gone) while the job still runs: it is not given whole nor in shares until
    that instance is released, and back as a MIG GPU its held instance is not given
    again."""
    state = _state()
    snap = state.node("mig0").snapshot
    outcome = state.place(PlacementRequest(mig_profile="3g.40gb"))
    assert outcome.placement is not None
    state.apply(outcome.placement)
    task = outcome.placement.tasks[0]
    parent, instance = task.gpu_uuids[0], task.mig_uuids[0]
    gpus = [g.model_copy(update={"mig_enabled": False}) for g in snap.gpus]
    flat = snap.model_copy(update={"seq": 1, "gpus": gpus, "mig_instances": []})
    state.upsert(flat)
    given: list[str] = []
    while (placed := state.place(PlacementRequest(gpus=1))).placement is not None:
        state.apply(placed.placement)
        given += placed.placement.tasks[0].gpu_uuids
    assert parent not in given and len(given) == len(gpus) - 1
    with pytest.raises(AllocationError):
        state.allocate_share("mig0", parent, 0.5)
    # Back in MIG mode the instance is still held; released, its GPU is free again.
    state.upsert(snap.model_copy(update={"seq": 2}))
    with pytest.raises(AllocationError):
        state.allocate("mig0", (), [instance])
    state.release("mig0", (), [instance])
    state.upsert(flat.model_copy(update={"seq": 3}))
    placed = state.place(PlacementRequest(gpus=1))
    assert placed.placement is not None and placed.placement.tasks[0].gpu_uuids == (parent,)


def test_a_held_uuid_reported_as_the_other_kind_stays_held() -> None:
    """Held as a MIG instance, listed next as a GPU (and the reverse): not free as the new
    kind, and not given again as such."""
    state = _state()
    snap = state.node("mig0").snapshot
    outcome = state.place(PlacementRequest(mig_profile="3g.40gb"))
    assert outcome.placement is not None
    state.apply(outcome.placement)
    held = outcome.placement.tasks[0].mig_uuids[0]
    gpus = [
        g.model_copy(update={"mig_enabled": False, "uuid": held if g.index == 0 else g.uuid})
        for g in snap.gpus
    ]
    state.upsert(snap.model_copy(update={"seq": 1, "gpus": gpus, "mig_instances": []}))
    # GPU 0 is the held device; the instance's own GPU is held too (its job may run on).
    busy = {0, outcome.placement.tasks[0].gpu_indices[0]}
    for _ in range(len(gpus) - len(busy)):
        placed = state.place(PlacementRequest(gpus=1))
        assert placed.placement is not None and held not in placed.placement.tasks[0].gpu_uuids
        state.apply(placed.placement)
    assert state.place(PlacementRequest(gpus=1)).placement is None
    with pytest.raises(AllocationError, match="another kind"):
        state.allocate("mig0", {held}, set(), set())

    # The reverse: a GPU held whole, its UUID listed next as a MIG instance's.
    whole = ClusterState()
    plain = build_profile("hgx-h100", "h0")
    whole.upsert(plain)
    first = whole.place(PlacementRequest(gpus=1))
    assert first.placement is not None
    whole.apply(first.placement)
    gpu = first.placement.tasks[0].gpu_uuids[0]
    index = next(g.index for g in plain.gpus if g.uuid == gpu)
    instance = snap.mig_instances[0].model_copy(update={"uuid": gpu, "parent_gpu": index})
    turned = [
        g.model_copy(update={"mig_enabled": True, "uuid": "GPU-new"}) if g.index == index else g
        for g in plain.gpus
    ]
    whole.upsert(plain.model_copy(update={"seq": 1, "gpus": turned, "mig_instances": [instance]}))
    assert whole.place(PlacementRequest(mig_profile=instance.profile)).placement is None


class _CountingInstances(tuple):  # type: ignore[type-arg]
    """A snapshot's MIG instances that count how often they are walked."""

    walks = 0

    def __iter__(self):  # type: ignore[no-untyped-def]
        type(self).walks += 1
        return super().__iter__()


def test_free_slices_are_read_once_per_node_not_per_candidate() -> None:
    # A node reporting thousands of instances made every candidate instance walk all
    # of them again for its GPU's free slices: quadratic (2.6 s for one /place of a
    # 4,032-instance report). The walk is bounded per node, whatever the count.
    state = _state()
    snap = state.node("mig0").snapshot
    candidates = sum(1 for i in snap.mig_instances if i.profile == "1g.10gb")
    counted = _CountingInstances(snap.mig_instances)
    object.__setattr__(snap, "mig_instances", counted)
    _CountingInstances.walks = 0
    outcome = state.place(PlacementRequest(mig_profile="1g.10gb"))
    assert outcome.placement is not None
    assert candidates >= 8
    assert _CountingInstances.walks <= 6, _CountingInstances.walks


def test_a_mig_request_runs_only_on_the_gpu_models_and_memory_it_accepts() -> None:
    # Both nodes offer 1g.10gb instances; the request's models and memory were not read for
    # MIG, so a job that accepts only H100s got an instance of an A100.
    state = _state()
    state.upsert(build_profile("hgx-h100-mig", "h100"))
    for policy in ("pack", "spread"):
        for models, node in ((("H100",), "h100"), (("A100",), "mig0")):
            request = PlacementRequest(mig_profile="1g.10gb", gpu_models=models, policy=policy)
            outcome = state.place(request)
            assert outcome.placement is not None, outcome.summary()
            assert outcome.placement.tasks[0].node == node
    a100 = state.node("mig0").snapshot.gpus[0].memory_mib
    roomy = state.place(PlacementRequest(mig_profile="1g.10gb", min_gpu_memory_mib=a100))
    assert roomy.placement is not None and roomy.placement.nodes == ("mig0",)
    none = state.place(PlacementRequest(mig_profile="1g.10gb", gpu_models=("B200",)))
    assert none.status == "unresolvable"
    assert {r.cause for r in none.reasons} == {Cause.GPU_MODEL}
    verdicts = {
        v.node: v
        for v in state.evaluate(PlacementRequest(mig_profile="1g.10gb", gpu_models=("H100",)))
    }
    assert verdicts["h100"].fits and verdicts["mig0"].cause is Cause.GPU_MODEL


def test_a_mig_task_gets_the_cpus_it_asks_near_its_gpu() -> None:
    # cpus_per_task was not read for MIG: the task reserved no CPU at all.
    state = _state()
    snap = state.node("mig0").snapshot
    per_numa = len(snap.numa_cpus(3))  # GPUs 0 and 1 (1g.10gb on each), as GPU 3 on NUMA 1
    request = PlacementRequest(
        mig_profile="1g.10gb", tasks=2, cpus_per_task=per_numa, numa="required"
    )
    outcome = state.place(request)
    assert outcome.placement is not None, outcome.summary()
    a, b = outcome.placement.tasks
    assert len(a.cpus) == len(b.cpus) == per_numa and not set(a.cpus) & set(b.cpus)
    assert {a.numa_nodes, b.numa_nodes} == {(3,), (1,)}
    for task in (a, b):
        gpu = snap.gpus[task.gpu_indices[0]]
        assert set(task.cpus) <= set(snap.numa_cpus(gpu.numa_node or 0))
    state.apply(outcome.placement)
    refused = state.place(
        PlacementRequest(mig_profile="1g.10gb", cpus_per_task=per_numa, numa="required")
    )
    assert refused.status == "unschedulable"
    assert [r.cause for r in refused.reasons] == [Cause.CPUS]
    too_many = state.place(PlacementRequest(mig_profile="1g.10gb", cpus_per_task=4096))
    assert too_many.status == "unresolvable"


def test_a_mig_task_counts_its_host_cpu_and_memory() -> None:
    # cpu_milli and memory_mib were not read for MIG: a task asking more host CPU than the
    # node has was placed, and held none, so whole-GPU tasks were placed on CPU it used.
    state = _state()
    state.set_host_capacity("mig0", 10_000, 100_000)
    too_much = state.place(PlacementRequest(mig_profile="1g.10gb", cpu_milli=20_000))
    assert too_much.status == "unresolvable"  # more than the node has: never
    assert [r.cause for r in too_much.reasons] == [Cause.HOST]
    gang = state.place(PlacementRequest(mig_profile="1g.10gb", tasks=2, cpu_milli=6_000))
    assert gang.status == "unschedulable", gang.summary()
    one = state.place(PlacementRequest(mig_profile="1g.10gb", cpu_milli=6_000, memory_mib=512))
    assert one.placement is not None
    task = one.placement.tasks[0]
    assert (task.cpu_milli, task.memory_mib) == (6_000, 512)
    state.apply(one.placement)
    assert state.host_used("mig0") == (6_000, 512)
    after = state.place(PlacementRequest(gpus=1, cpu_milli=6_000))
    assert after.status == "unschedulable" and after.reasons[0].cause is Cause.HOST
