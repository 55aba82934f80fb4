"""Each baseline scheduler follows its published rule; FGD's measure as the paper defines it."""

from __future__ import annotations

import numpy as np
import pytest

from bench.baselines import slurm_greedy_gpus
from bench.cluster_policies import BaselineFleet, Task
from bench.fgd import Fragmentation, TaskType, task_fragmentation
from bench.fill_quality import designs, run, totals
from placement.profiles import build_profile


def fleet(policy: str, *profiles: str) -> BaselineFleet:
    snaps = [build_profile(p, f"n{i}") for i, p in enumerate(profiles)]
    mix = {TaskType(1, 1000): 1.0, TaskType(1, 500): 1.0}
    return BaselineFleet(snaps, policy, mix)


def test_first_fit_takes_the_first_node_and_lowest_gpus() -> None:
    f = fleet("first-fit", "dgx1-v100", "dgx1-v100")
    assert f.place(Task(2, 1000)) is not None
    held = f.place(Task(3, 1000))
    assert held is not None and (held.node, held.gpus) == (0, (2, 3, 4))
    share = f.place(Task(1, 300))
    assert share is not None and (share.node, share.gpus) == (0, (5,))


def test_best_fit_takes_the_node_left_with_least_room() -> None:
    f = fleet("best-fit", "dgx1-v100", "dgx1-v100")
    f.rooms[1, :6] = 0  # node 1: 2 GPUs free
    f._change(1, (), 0)
    held = f.place(Task(2, 1000))
    assert held is not None and (held.node, held.gpus) == (1, (6, 7))
    f.rooms[0, 0] = 600  # a shared GPU with 600 left
    f.rooms[0, 1] = 300  # and one with 300 left
    f._change(0, (), 0)
    share = f.place(Task(1, 250))
    assert share is not None and (share.node, share.gpus) == (0, (1,))


def test_whole_gpu_tasks_never_take_a_shared_gpu() -> None:
    f = fleet("first-fit", "workstation-2x-a6000")
    assert f.place(Task(1, 100)) is not None
    held = f.place(Task(2, 1000))
    assert held is None
    one = f.place(Task(1, 1000))
    assert one is not None and one.gpus == (1,)
    assert f.place(Task(1, 950)) is None  # 900 left on GPU 0
    released = f.place(Task(1, 900))
    assert released is not None and released.gpus == (0,)


def test_best_effort_uses_go_gpuallocator_partitions() -> None:
    f = fleet("best-effort", "dgx1-v100")
    held = f.place(Task(2, 1000))
    assert held is not None
    # all free: the best group of the best partition is a pair of NV2 links
    bw = f.wiring[0].bw
    assert bw[held.gpus[0], held.gpus[1]] == bw.max()


def test_slurm_greedy_fills_the_socket_with_most_free_gpus() -> None:
    sockets = (0, 0, 0, 0, 1, 1, 1, 1)
    assert slurm_greedy_gpus([0, 4, 5, 6], 2, sockets) == (4, 5)
    assert slurm_greedy_gpus([0, 1, 4, 5], 3, sockets) == (0, 1, 4)
    bw = np.ones((8, 8))
    bw[4, 6] = bw[6, 4] = 50.0
    assert slurm_greedy_gpus([4, 5, 6, 7], 2, sockets, bw) == (4, 6)
    assert slurm_greedy_gpus([0], 2, sockets) is None


def test_fgd_fragmentation_as_published() -> None:
    whole, share = TaskType(1, 1000), TaskType(1, 500)
    assert task_fragmentation((1000, 400, 0), whole, True) == 400  # the partial GPU
    assert task_fragmentation((1000, 400, 0), share, True) == 400  # 400 < 500
    assert task_fragmentation((400, 300), whole, True) == 700  # cannot place at all
    assert task_fragmentation((1000,), TaskType(1, 1000, ("T4",)), False) == 1000
    frag = Fragmentation({whole: 1.0, share: 1.0})
    assert frag.of("X", (1000, 400)) == pytest.approx(400)


def test_fgd_places_where_fragmentation_grows_least() -> None:
    snaps = [build_profile("workstation-2x-a6000", f"n{i}") for i in range(2)]
    f = BaselineFleet(snaps, "fgd", {TaskType(1, 500): 1.0})
    first = f.place(Task(1, 500))
    assert first is not None
    second = f.place(Task(1, 500))
    # the same GPU again: a 500 share fits exactly, leaving three whole GPUs
    assert second is not None and (second.node, second.gpus) == (first.node, first.gpus)
    with pytest.raises(ValueError, match="task mix"):
        BaselineFleet(snaps, "fgd", None)


def test_fill_quality_engine_keeps_at_least_as_many_best_four_sets() -> None:
    real = {name: tc for name, tc in designs().items() if "(real)" in name}
    results = run(real, fills=3, masks=30, seed=3)
    for mode in results:
        sums = totals(results[mode])
        engine = sums["engine"]
        assert engine.pair_break == 0 and engine.degraded == 0
        for name, other in sums.items():
            for counter in ("ring4", "ring4+pair"):
                assert engine.kept[counter] / max(engine.chances[counter], 1) >= (
                    other.kept[counter] / max(other.chances[counter], 1)
                ), (mode, name, counter)


def test_fgd_counts_every_free_gpu_of_a_host_short_node() -> None:
    task = TaskType(1, 1000, cpu_milli=8000, memory_mib=1024)
    assert task_fragmentation((1000, 1000), task, True) == 0
    assert task_fragmentation((1000, 1000), task, True, cpu_free=4000) == 2000
    assert task_fragmentation((1000, 1000), task, True, memory_free=512) == 2000
    frag = Fragmentation({task: 1.0, TaskType(0, 1000, cpu_milli=1): 5.0})  # CPU-only: left out
    assert frag.of("V100", (1000, 1000), 9000, 4096) == 0.0
    assert frag.of("V100", (1000, 1000), 7999, 4096) == 2000.0


def hosted(policy: str, hosts: dict[str, tuple[int | None, int | None]]) -> BaselineFleet:
    snaps = [build_profile("dgx1-v100", f"n{i}") for i in range(len(hosts))]
    mix = {TaskType(1, 1000, cpu_milli=4000): 1.0}
    return BaselineFleet(snaps, policy, mix, hosts)


@pytest.mark.parametrize("policy", ["first-fit", "best-fit", "best-effort", "slurm-greedy", "fgd"])
def test_every_baseline_skips_a_node_short_of_cpu(policy: str) -> None:
    f = hosted(policy, {"n0": (2000, None), "n1": (None, None)})
    held = f.place(Task(1, 1000, cpu_milli=4000))
    assert held is not None and held.node == 1
    assert f.host.of(0)[0] == 2000
    share = f.place(Task(1, 250, cpu_milli=3000))
    assert share is not None and share.node == 1
    f.release(held)
    assert f.place(Task(1, 1000, cpu_milli=2001, memory_mib=0)) is not None


def test_best_fit_weighs_cpu_left_with_gpus_left() -> None:
    # After a job only n0's CPU holds, n0: 6 GPUs and 44 cores free; n1: 8 GPUs and 16
    # cores. GPU-only best-fit would take n0 (fewer GPUs left); counted with CPU (5 cores
    # per GPU here) n1 is fuller.
    f = hosted("best-fit", {"n0": (64000, None), "n1": (16000, None)})
    first = f.place(Task(2, 1000, cpu_milli=20000))
    assert first is not None and f.whole.tolist() == [6, 8]
    held = f.place(Task(1, 1000, cpu_milli=1000))
    assert held is not None and held.node == 1
    gpu_only = hosted("best-fit", {"n0": (None, None), "n1": (None, None)})
    assert gpu_only.place(Task(2, 1000, cpu_milli=20000)) is not None
    other = gpu_only.place(Task(1, 1000, cpu_milli=1000))
    assert other is not None and other.node == 0


def test_a_cpu_only_task_takes_cpu_on_the_rule_s_node() -> None:
    f = hosted("best-fit", {"n0": (64000, None), "n1": (16000, None)})
    held = f.place(Task(0, 1000, cpu_milli=8000))
    assert held is not None and held.gpus == () and held.node == 1
    assert f.host.of(1)[0] == 8000 and f.room_of(1) == [1000] * 8
    f.release(held)
    assert f.host.of(1)[0] == 16000
