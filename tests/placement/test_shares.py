"""GPU shares (gpu_fraction): shared GPUs first, never a whole-held GPU, sums <= 1."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from placement import ClusterState, PlacementRequest
from placement.analysis import _room_stats
from placement.cluster import AllocationError, SharesUnsupported
from placement.profiles import build_profile
from placement.snapshot import Health
from tests.placement.conftest import dgx1_nodes as cluster
from tests.placement.conftest import place_applied as place


def share(f: float) -> PlacementRequest:
    return PlacementRequest(gpu_fraction=f)


def test_shares_fill_a_shared_gpu_before_opening_a_whole_one() -> None:
    state = cluster("a", "b")
    first = place(state, share(0.5))
    assert place(state, share(0.25)) == first
    assert place(state, share(0.25)) == first  # exactly full: 0.5 + 0.25 + 0.25
    fourth = place(state, share(0.25))
    assert fourth != first
    assert state.node(fourth[0]).shares_by_index[fourth[1][0]] == 250


def test_tightest_shared_gpu_wins() -> None:
    state = cluster("a")
    snap = state.node("a").snapshot
    state.allocate_share("a", snap.gpus[0].uuid, 0.5)
    state.allocate_share("a", snap.gpus[1].uuid, 0.7)
    assert place(state, share(0.2)) == ("a", (1,))  # 0.1 left on GPU 1, not 0.3 on GPU 0
    assert place(state, share(0.5)) == ("a", (0,))


def test_whole_gpu_jobs_never_share_and_shares_never_take_whole_held_gpus() -> None:
    state = cluster("a")
    snap = state.node("a").snapshot
    for _ in range(7):
        place(state, PlacementRequest(gpus=1))
    _, (shared,) = place(state, share(0.3))
    held = {g.uuid for g in snap.gpus} - {snap.gpus[shared].uuid}
    assert state.node("a").held_gpus == held  # the share went to the one GPU not held whole
    assert state.place(PlacementRequest(gpus=1)).status == "unschedulable"
    with pytest.raises(AllocationError, match="holds shares"):
        state.allocate("a", [snap.gpus[shared].uuid])
    with pytest.raises(AllocationError, match="held whole"):
        state.allocate_share("a", next(iter(held)), 0.1)
    with pytest.raises(AllocationError, match="left"):
        state.allocate_share("a", snap.gpus[shared].uuid, 0.8)


def test_last_share_released_frees_the_whole_gpu() -> None:
    state = cluster("a")
    outcome = state.place(share(0.4))
    assert outcome.placement is not None
    state.apply(outcome.placement)
    assert state.node("a").free_mask.bit_count() == 7
    state.unapply(outcome.placement)
    assert state.node("a").free_mask.bit_count() == 8
    assert not state.node("a").shares


def test_a_share_opens_the_gpu_a_one_gpu_job_would_get() -> None:
    """On a whole GPU a share follows the 1-GPU rules: no free NVLink pair broken."""
    state = cluster("a")
    snap = state.node("a").snapshot
    state.allocate("a", [g.uuid for g in snap.gpus if g.index in (1, 2, 4, 6, 7)])
    # free: 0, 3 (an NV2 pair) and 5 (its partners 1, 4, 6, 7 busy)
    assert place(state, share(0.5)) == ("a", (5,))


def test_request_rules() -> None:
    with pytest.raises(ValidationError):
        PlacementRequest(gpu_fraction=1.0)
    with pytest.raises(ValidationError):
        PlacementRequest(gpu_fraction=0.0)
    with pytest.raises(ValidationError, match="one task"):
        PlacementRequest(gpu_fraction=0.5, gpus=2)
    with pytest.raises(ValidationError, match="one task"):
        PlacementRequest(gpu_fraction=0.5, tasks=2)
    assert PlacementRequest(gpu_fraction=0.46).share_milli == 460


def test_a_state_without_shares_refuses_them() -> None:
    state = ClusterState(shares=False)
    state.upsert(build_profile("dgx1-v100", "a"))
    with pytest.raises(SharesUnsupported, match="without GPU shares"):
        state.place(share(0.5))
    with pytest.raises(SharesUnsupported):
        cluster("a").evaluate(share(0.5))


def test_shares_respect_model_constraints() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "v"))
    state.upsert(build_profile("hgx-h100", "h"))
    assert place(state, PlacementRequest(gpu_fraction=0.5, gpu_models=("H100",)))[0] == "h"
    assert place(state, PlacementRequest(gpu_fraction=0.5, gpu_models=("V100",)))[0] == "v"


def test_set_share_puts_a_gpu_at_exactly_that_count() -> None:
    """What a store of record says a GPU's shares are (the service's sync): up, down, 0."""
    state = cluster("a")
    gpus = [g.uuid for g in state.node("a").snapshot.gpus]
    state.set_share("a", gpus[0], 1000)  # four quarters: a full pool, no free thousandth
    assert state.node("a").shares == {gpus[0]: 1000}
    assert state.node("a").free_mask.bit_count() == 7
    assert place(state, share(0.25)) != ("a", (0,))
    state.set_share("a", gpus[0], 250)
    assert state.node("a").shares[gpus[0]] == 250
    state.set_share("a", gpus[0], 0)
    assert gpus[0] not in state.node("a").shares
    assert state.node("a").free_mask.bit_count() == 7  # the share placed above stays
    state.allocate("a", [gpus[2]])
    with pytest.raises(AllocationError, match="held whole"):
        state.set_share("a", gpus[2], 100)
    with pytest.raises(AllocationError, match="0 to 1000"):
        state.set_share("a", gpus[0], 1001)
    # A GPU the snapshot does not list (gone from this report) keeps what the store says
    # by UUID, as a whole-GPU hold does, and counts for no GPU of this snapshot.
    state.set_share("a", "GPU-gone", 100)
    assert state.node("a").shares["GPU-gone"] == 100
    assert 100 not in state.node("a").shares_by_index.values()


def test_a_shared_gpu_without_the_cpus_asked_passes_to_the_next_shared_one() -> None:
    """The tightest shared GPU's node has no CPU left: the share goes on the next shared
    GPU with room (another node's), not on a whole GPU opened while one had room."""
    state = cluster("a", "b")
    a, b = state.node("a").snapshot, state.node("b").snapshot
    state.allocate_share("a", a.gpus[0].uuid, 0.7)  # the tightest fit
    state.allocate_share("b", b.gpus[0].uuid, 0.5)
    assert [n.cpus for n in a.numa_nodes] == ["0-19,40-59", "20-39,60-79"]
    state.allocate("a", cpus=range(80))  # every CPU of node a taken
    assert place(state, PlacementRequest(gpu_fraction=0.2, cpus_per_task=2)) == ("b", (0,))
    assert dict(state.node("b").shares_by_index) == {0: 700}


def test_a_share_is_counted_in_thousandths_rounded_up_and_answered_so() -> None:
    assert PlacementRequest(gpu_fraction=0.1 + 0.2).share_milli == 300  # float noise
    assert PlacementRequest(gpu_fraction=0.3334).share_milli == 334
    assert PlacementRequest(gpu_fraction=5e-324).share_milli == 1
    with pytest.raises(ValidationError, match="gpus=1"):
        PlacementRequest(gpu_fraction=0.9991)
    placed = cluster("a").place(share(0.3334)).placement
    assert placed is not None and placed.tasks[0].gpu_fraction == 0.334  # what is counted


def test_room_on_an_unhealthy_shared_gpu_counts_as_no_capacity() -> None:
    """The ranking's free capacity (share room, the room per share size) leaves out a
    shared GPU that went unhealthy: no share can go there, as /place already knows."""
    state = cluster("a")
    snap = state.node("a").snapshot
    state.allocate_share("a", snap.gpus[0].uuid, 0.25)
    state.allocate_share("a", snap.gpus[1].uuid, 0.5)
    table = state._table
    slot = table.slot_of["a"]
    assert table.share_room[slot] == 750 + 500
    sick = snap.gpus[0].model_copy(update={"health": Health.UNHEALTHY})
    state.upsert(snap.model_copy(update={"gpus": [sick, *snap.gpus[1:]]}))
    assert table.share_room[slot] == 500
    below, largest = _room_stats(table, np.array([slot]), np.array([250, 600]))
    assert largest.tolist() == [500]
    assert below.tolist() == [[0.0, 500.0]]
    # Healthy again: its room is capacity again.
    state.upsert(snap)
    assert table.share_room[slot] == 750 + 500


def test_unapplying_a_share_the_store_set_to_none_frees_its_cpus() -> None:
    """The store said the GPU holds no shares (set_share 0: another writer's hold came
    first) before the share's placement was undone: its CPUs, which set_share leaves
    alone, are the task's and go with it."""
    state = cluster("a")
    outcome = state.place(PlacementRequest(gpu_fraction=0.5, cpus_per_task=2))
    assert outcome.placement is not None
    state.apply(outcome.placement)
    task = outcome.placement.tasks[0]
    assert state.node("a").held_cpus == set(task.cpus)
    state.set_share("a", task.gpu_uuids[0], 0)
    state.unapply(outcome.placement)
    assert state.node("a").held_cpus == frozenset()
