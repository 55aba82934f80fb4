"""Every policy places only where CPU, memory and GPUs fit; CPU-only jobs take CPU."""

from __future__ import annotations

import pytest

from placement import NodeSnapshot, PlacementRequest
from placement.profiles import build_profile
from topoplace.sim.jobs import Job
from topoplace.sim.policies import ALL_POLICIES, EnginePolicy, Policy, build_policies

UNKNOWN = (None, None)


def job(name: str, gpus: int, cpu: int, memory: int = 0, milli: int = 1000) -> Job:
    return Job(name, gpus, milli, (), 0.0, None, cpu_milli=cpu, memory_mib=memory)


def cpu_of(policy: Policy, node: str) -> int:
    rows = list(policy.rooms())
    return int(rows[["a", "b"].index(node)][2])


@pytest.fixture
def snaps() -> list[NodeSnapshot]:
    return [build_profile("dgx1-v100", "a"), build_profile("dgx1-v100", "b")]


@pytest.mark.parametrize("name", ALL_POLICIES)
@pytest.mark.parametrize("milli", [1000, 500])
def test_each_policy_refuses_a_node_whose_cpu_does_not_fit(
    snaps: list[NodeSnapshot], name: str, milli: int
) -> None:
    # node a, first in name order and the one every rule would take, has 4 cores
    hosts = {"a": (4000, None), "b": (64000, None)}
    jobs = [job("big", 1, 8000, milli=milli), job("small", 1, 2000)]
    (policy,) = build_policies([name], snaps, jobs, hosts)
    placed, _ = policy.place(jobs[0])
    assert placed is not None and placed.node == "b"
    assert cpu_of(policy, "b") == 56000 and cpu_of(policy, "a") == 4000


@pytest.mark.parametrize("name", ALL_POLICIES)
def test_each_policy_refuses_when_no_cpu_fits_anywhere(
    snaps: list[NodeSnapshot], name: str
) -> None:
    hosts = {"a": (4000, 1 << 20), "b": (64000, 1024)}  # b: CPU but not the memory
    jobs = [job("big", 1, 8000, memory=2048)]
    (policy,) = build_policies([name], snaps, jobs, hosts)
    placed, cause = policy.place(jobs[0])
    assert placed is None and cause == "no node with the CPU and memory free"


@pytest.mark.parametrize("name", ALL_POLICIES)
def test_a_cpu_only_job_takes_cpu_and_memory_and_gives_them_back(
    snaps: list[NodeSnapshot], name: str
) -> None:
    hosts = {"a": (16000, 65536), "b": (16000, 65536)}
    jobs = [job("cpu", 0, 12000, 32768), job("gpu", 1, 1000)]
    (policy,) = build_policies([name], snaps, jobs, hosts)
    placed, _ = policy.place(jobs[0])
    assert placed is not None and placed.gpus == ()
    rows = {n: r for n, r in zip("ab", policy.rooms(), strict=True)}
    assert rows[placed.node][2:] == (4000, 32768)
    assert sum(rows[placed.node][1]) == 8000  # no GPU taken
    second, _ = policy.place(job("cpu2", 0, 12000, 32768))
    assert second is not None and second.node != placed.node  # 4 cores left there
    assert policy.place(job("cpu3", 0, 12000, 32768))[0] is None
    policy.release(placed)
    rows = {n: r for n, r in zip("ab", policy.rooms(), strict=True)}
    assert rows[placed.node][2:] == (16000, 65536)


def test_without_host_figures_nothing_is_short(snaps: list[NodeSnapshot]) -> None:
    jobs = [job("huge", 8, 10**9, 10**9)]
    for policy in build_policies(ALL_POLICIES, snaps, jobs, {"a": UNKNOWN, "b": UNKNOWN}):
        placed, _ = policy.place(jobs[0])
        assert placed is not None and placed.node == "a", policy.name


def test_the_engine_leaves_a_cpu_only_job_to_the_schedulers_default_spread(
    snaps: list[NodeSnapshot],
) -> None:
    # kube-scheduler's LeastAllocated: the node with the larger share of CPU and memory
    # free after the job (b, 48 of 64 cores), not the tighter fit (a, 4 of 16)
    hosts = {"a": (16000, 65536), "b": (64000, 65536)}
    jobs = [job("cpu", 0, 12000, 1024)]
    (policy,) = build_policies(["topoplace"], snaps, jobs, hosts)
    placed, _ = policy.place(jobs[0])
    assert placed is not None and placed.node == "b"


def test_the_engine_counts_host_use_as_the_sim_does(snaps: list[NodeSnapshot]) -> None:
    hosts = {"a": (96000, 393216), "b": (96000, 393216)}
    jobs = [job("j1", 2, 30000, 100000), job("j2", 1, 5000, 2000, milli=500)]
    (policy,) = build_policies(["topoplace"], snaps, jobs, hosts)
    assert isinstance(policy, EnginePolicy)
    held = [policy.place(j)[0] for j in jobs]
    for name in "ab":
        cpu, memory = policy.host.of(policy.index[name])
        assert policy.state.host_room(name) == (cpu, memory)
    for placed in held:
        assert placed is not None
        policy.release(placed)
    assert policy.state.host_used("a") == policy.state.host_used("b") == (0, 0)


def test_the_engine_keeps_gpus_usable(snaps: list[NodeSnapshot]) -> None:
    # The trace's mix: 80 CPUs over 9 GPUs. a: 4 GPUs free, 40 CPUs; b: 4 GPUs, 70 CPUs
    # (its jobs took fewer CPUs). A 1-GPU job of 30 CPUs would strand 2 of a's GPUs and
    # none of b's: the engine takes b, where packing alone takes a (first in order).
    hosts = {"a": (80000, None), "b": (80000, None)}
    jobs = [job("a4", 4, 40000), job("b4", 4, 10000), job("new", 1, 30000)]
    (policy,) = build_policies(["topoplace"], snaps, jobs, hosts)
    assert isinstance(policy, EnginePolicy)
    for node, held in (("a", jobs[0]), ("b", jobs[1])):
        gpus = [g.uuid for g in policy.state.node(node).snapshot.gpus[:4]]
        policy.state.allocate(node, gpus, cpu_milli=held.cpu_milli)
        policy.host.take(policy.index[node], held.cpu_milli, 0)
    gpu_only = policy.state.place(PlacementRequest()).placement
    assert gpu_only is not None and gpu_only.nodes == ("a",)
    placed, _ = policy.place(jobs[2])
    assert placed is not None and placed.node == "b"


def test_the_engine_gets_the_traces_task_types(snaps: list[NodeSnapshot]) -> None:
    # As FGD gets the trace's task mix: GPU jobs with CPU or memory, counted per type.
    jobs = [
        job("a", 1, 4000, 100),
        job("b", 1, 4000, 100),
        job("c", 1, 2000, milli=250),
        job("d", 2, 0),  # no host figures: not of the engine's mix
        job("e", 0, 1000),  # no GPU
    ]
    engine = build_policies(["topoplace"], snaps, jobs, {"a": UNKNOWN, "b": UNKNOWN})[0]
    assert isinstance(engine, EnginePolicy)
    mix = engine.state._table.task_mix
    assert mix.configured
    assert mix._weights == {(1, 1000, 4000, 100): 2.0, (1, 250, 2000, 0): 1.0}
    without = build_policies(["topoplace"], snaps, jobs[3:], {"a": UNKNOWN, "b": UNKNOWN})[0]
    assert isinstance(without, EnginePolicy)
    assert not without.state._table.task_mix.configured  # observed, as the service's


def test_the_engine_gets_the_traces_model_demand(snaps: list[NodeSnapshot]) -> None:
    # As FGD's task types carry each job's models: GPUs asked per model list, () for any.
    jobs = [
        Job("a", 1, 1000, ("T4",), 0.0, None),
        Job("b", 1, 500, ("T4",), 0.0, None),
        Job("c", 2, 1000, (), 0.0, None),
        Job("e", 0, 1000, ("T4",), 0.0, None, cpu_milli=1000),  # no GPU: asks no model's
    ]
    engine = build_policies(["topoplace"], snaps, jobs, {"a": UNKNOWN, "b": UNKNOWN})[0]
    assert isinstance(engine, EnginePolicy)
    demand = engine.state._table.model_demand
    assert demand.configured
    assert demand.by_list == {("T4",): 1.5} and demand.total == 3.5
    without = build_policies(["topoplace"], snaps, jobs[2:], {"a": UNKNOWN, "b": UNKNOWN})[0]
    assert isinstance(without, EnginePolicy)
    assert not without.state._table.model_demand.configured  # no model named: observed
