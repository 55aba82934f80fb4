"""The task mix and FGD's expected fragmentation of a node's free capacity (placement.task_mix)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from placement import ClusterState, PlacementRequest
from placement.profiles import build_profile
from placement.task_mix import (
    FULL,
    MAX_TYPES,
    REFRESH,
    TaskMix,
    TaskType,
    expected,
    expected_added,
    room_stats,
)
from tests.placement.conftest import place_applied as place


def reference(
    mix: dict[TaskType, float], rooms: list[int], cpu_free: float, memory_free: float
) -> float:
    """F from its definition, type by type: the free thousandths each type cannot use."""
    total = sum(mix.values())
    free = sum(rooms)
    out = 0.0
    for (gpus, milli, cpu, memory), weight in mix.items():
        host = cpu <= cpu_free and memory <= memory_free
        if milli < FULL:
            fits = host and any(r >= milli for r in rooms)
            lost = sum(r for r in rooms if r < milli) if fits else free
        else:
            fits = host and sum(1 for r in rooms if r == FULL) >= gpus
            lost = sum(r for r in rooms if r < FULL) if fits else free
        out += weight / total * lost
    return out / FULL


def random_mix(rng: random.Random) -> dict[TaskType, float]:
    mix: dict[TaskType, float] = {}
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.5:
            t: TaskType = (1, rng.choice([110, 250, 500, 810]), rng.randint(0, 16) * 1000, 0)
        else:
            t = (rng.choice([1, 2, 4, 8]), FULL, rng.randint(0, 16) * 1000, rng.randint(0, 4))
        mix[t] = rng.randint(1, 50)
    return mix


def test_the_figure_is_fgds_definition_on_random_nodes() -> None:
    rng = random.Random(7)
    for _ in range(300):
        weights = random_mix(rng)
        arrays = TaskMix(weights).arrays()
        assert arrays is not None
        nodes = []
        for _ in range(6):
            rooms = [rng.choice([0, FULL, FULL, rng.randint(1, FULL - 1)]) for _ in range(8)]
            cpu = math.inf if rng.random() < 0.2 else float(rng.randint(-1, 16) * 1000)
            nodes.append((rooms, cpu, float(rng.randint(0, 5))))
        partial = [[r for r in rooms if 0 < r < FULL] for rooms, _, _ in nodes]
        stats = [room_stats(p, arrays.sizes) for p in partial]
        got = expected(
            arrays,
            np.asarray([sum(r == FULL for r in rooms) for rooms, _, _ in nodes], dtype=np.int64),
            np.asarray([float(sum(p)) for p in partial]),
            np.asarray([largest for _, largest in stats], dtype=np.int64),
            np.asarray([below for below, _ in stats]).reshape(len(nodes), arrays.sizes.size),
            np.asarray([cpu for _, cpu, _ in nodes]),
            np.asarray([memory for _, _, memory in nodes]),
        )
        want = [reference(weights, rooms, cpu, memory) for rooms, cpu, memory in nodes]
        assert got == pytest.approx(want, abs=1e-9)


def two_nodes(
    task_mix: dict[TaskType, float] | None,
    a: tuple[int, int] = (2, 12),
    b: tuple[int, int] = (3, 36),
) -> ClusterState:
    """DGX-1s a and b of 80 CPUs, with (GPUs free, CPUs free); 10 CPUs per GPU asked."""
    state = ClusterState(host_mix=(10000.0, 0.0), task_mix=task_mix)
    for name, (gpus, cpus) in (("a", a), ("b", b)):
        busy, cpu = 8 - gpus, 80000 - cpus * 1000
        state.upsert(build_profile("dgx1-v100", name))
        state.set_host_capacity(name, 80000, None)
        uuids = [g.uuid for g in state.node(name).snapshot.gpus[:busy]]
        state.allocate(name, uuids)
        state.set_host_use(name, cpu, 0)  # a store's count: not a task of the mix
    return state


def test_the_node_left_usable_for_the_mix_wins_over_packing() -> None:
    # A 1-GPU task of 10 CPUs, where every task asks that: on a it leaves 1 GPU with 2
    # CPUs, a GPU no task of the mix can use; on b 2 GPUs with 26 CPUs, both usable. The
    # mean figures per GPU strand as much either way (0.8 GPUs on a before and after, none
    # on b), so packing alone took a.
    request = PlacementRequest(cpu_milli=10000)
    assert place(two_nodes(None), request)[0] == "a"  # nothing observed yet: as before
    assert place(two_nodes({(1, FULL, 10000, 0): 1.0}), request)[0] == "b"


def test_a_small_task_takes_a_gpu_the_mix_cannot_use() -> None:
    # Every task of the mix asks 30 CPUs: a's 3 GPUs (29 CPUs) are lost to it already, b's
    # 2 (36 CPUs) are not. A task of 1 CPU on a uses one of a's lost GPUs; on b it would
    # leave b's last GPU with 35 CPUs, usable. Packing alone took b (1 GPU left, not 2);
    # the mean figures strand 0.1 GPUs on a either way (rounded: none).
    state = two_nodes({(1, FULL, 30000, 0): 1.0}, a=(3, 29), b=(2, 36))
    assert place(state, PlacementRequest(cpu_milli=1000))[0] == "a"
    assert place(two_nodes(None, a=(3, 29), b=(2, 36)), PlacementRequest(cpu_milli=1000))[0] == "b"


def test_requests_without_host_figures_are_ranked_as_before() -> None:
    state = two_nodes({(1, FULL, 10000, 0): 1.0})
    assert place(state, PlacementRequest())[0] == "a"


def test_the_mix_is_observed_from_applied_tasks_and_bounded() -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "a"))
    place(state, PlacementRequest(gpus=2, cpu_milli=8000, memory_mib=1000))
    place(state, PlacementRequest(gpu_fraction=0.25, cpu_milli=1000))
    place(state, PlacementRequest(gpus=1))  # no host figures: not of the mix
    mix = state._table.task_mix
    assert len(mix) == 2
    arrays = mix.arrays()
    assert arrays is not None
    assert arrays.sizes.tolist() == [250] and arrays.whole_sizes.tolist() == [2]
    assert arrays.whole_weight == arrays.share_weight == 0.5

    bounded = TaskMix()
    for _ in range(3):
        bounded.observe(1, 4000, 0)  # asked often: stays
    for cpu in range(MAX_TYPES * 2):
        bounded.observe(1, 100_000 + cpu, 0)
    assert len(bounded) == MAX_TYPES
    assert (1, FULL, 4000, 0) in bounded._weights


def test_an_observed_mix_is_built_again_only_every_refresh_tasks() -> None:
    mix = TaskMix()
    for _ in range(REFRESH):
        mix.observe(1, 1000, 0)
        first = mix.arrays()
    mix.observe(2, 1000, 0)  # past the first REFRESH: the built tables stay a while
    assert mix.arrays() is first
    for _ in range(REFRESH - 1):
        mix.observe(2, 1000, 0)
    built = mix.arrays()
    assert built is not first and built is not None
    assert built.whole_sizes.tolist() == [1, 2]


@pytest.mark.parametrize(
    "bad",
    [
        {(0, FULL, 0, 0): 1.0},
        {(2, 500, 0, 0): 1.0},  # a share is of one GPU
        {(1, 0, 0, 0): 1.0},
        {(1, FULL, -1, 0): 1.0},
        {(1, FULL, 0, 0): 0.0},
        {(1, FULL, 0, 0): math.nan},
    ],
)
def test_a_bad_configured_mix_is_refused(bad: dict[TaskType, float]) -> None:
    with pytest.raises(ValueError):
        ClusterState(task_mix=bad)


def test_a_choices_cost_is_the_figure_after_less_before() -> None:
    # A share opening a whole GPU leaves the rest of it free, shared: the figure after
    # counts that room as any other shared GPU's.
    rng = random.Random(11)
    for _ in range(200):
        weights = random_mix(rng)
        arrays = TaskMix(weights).arrays()
        assert arrays is not None
        rooms = [rng.choice([0, FULL, FULL, rng.randint(1, FULL - 1)]) for _ in range(8)]
        whole = sum(r == FULL for r in rooms)
        if not whole:
            continue
        share = rng.random() < 0.5
        k = 1 if share else rng.randint(1, whole)
        left = rng.randint(1, FULL - 1) if share else 0
        cpu, memory = float(rng.randint(0, 16) * 1000), 4.0
        task_cpu = rng.randint(0, 8) * 1000
        partial = [r for r in rooms if 0 < r < FULL]
        below, largest = room_stats(partial, arrays.sizes)
        got = expected_added(
            arrays,
            np.asarray([whole], dtype=np.int64),
            k,
            np.asarray([float(sum(partial))]),
            np.asarray([largest], dtype=np.int64),
            below.reshape(1, arrays.sizes.size),
            np.asarray([cpu]),
            np.asarray([memory]),
            task_cpu,
            0,
            left,
        )
        after = [r for r in rooms if r != FULL] + [FULL] * (whole - k) + ([left] if left else [])
        want = reference(weights, after, cpu - task_cpu, memory) - reference(
            weights, rooms, cpu, memory
        )
        assert float(got[0]) == pytest.approx(want, abs=1e-9)


def test_room_statistics_follow_the_shares_as_they_change() -> None:
    # Kept per node between decisions and recomputed only where a node changed: after
    # every change each node's row is what its shared GPUs' rooms give now.
    state = ClusterState(task_mix={(1, 250, 1000, 0): 1.0, (1, 600, 1000, 0): 1.0})
    for name in ("a", "b"):
        state.upsert(build_profile("dgx1-v100", name))
    uuid = state.node("a").snapshot.gpus[0].uuid
    request = PlacementRequest(cpu_milli=1000)
    table = state._table
    for change in (
        lambda: state.allocate_share("a", uuid, 0.5),
        lambda: state.allocate_share("a", uuid, 0.3),
        lambda: state.release_share("a", uuid, 0.5),
        lambda: state.release_share("a", uuid, 0.3),
    ):
        change()
        assert state.place(request).placement is not None  # fills the statistics
        assert table.room_cache is not None
        sizes, below, largest, _ = table.room_cache
        for name in ("a", "b"):
            slot = table.slot_of[name]
            rooms = [FULL - held for held in table.shared.get(slot, {}).values()]
            want_below, want_largest = room_stats(rooms, np.asarray(sizes, dtype=np.int64))
            assert below[slot].tolist() == want_below.tolist()
            assert largest[slot] == want_largest
