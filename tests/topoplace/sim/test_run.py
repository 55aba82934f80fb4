"""The figures count GPUs stranded by a node's CPU: free, unallocated and fragmented."""

from __future__ import annotations

import time

import pytest

from placement.profiles import build_profile
from topoplace.sim.jobs import Job
from topoplace.sim.policies import ALL_POLICIES, build_policies
from topoplace.sim.run import _Meter, simulate


def job(name: str, gpus: int, cpu: int) -> Job:
    return Job(name, gpus, 1000, (), 0.0, None, cpu_milli=cpu, memory_mib=0)


@pytest.mark.parametrize("name", ALL_POLICIES)
def test_a_cpu_bound_node_strands_its_gpus(name: str) -> None:
    snaps = [build_profile("dgx1-v100", "a")]
    hosts = {"a": (16000, None)}  # 8 GPUs, 16 cores: two 8-core jobs spend the CPU
    jobs = [job("j0", 1, 8000), job("j1", 1, 8000), job("j2", 1, 8000), job("c", 0, 100)]
    (policy,) = build_policies([name], snaps, jobs, hosts)
    result = simulate(policy, snaps, jobs, "fill", time.perf_counter() + 30, None, 16000)
    assert result.started == 2 and result.first_failure_at == 2
    assert result.failed_job is not None and result.failed_job.name == "j2"
    assert result.unallocated_at_failure == 6.0  # six GPUs free, none usable
    assert result.causes["no node with the CPU and memory free"] == 2  # j2 and c
    assert result.end_rate == pytest.approx(2 / 8)
    assert result.end_cpu_rate == pytest.approx(1.0)
    # FGD's measure: every free GPU is fragmented, no GPU task of the mix fits the host
    assert _Meter(policy, snaps, jobs).fragmentation() == pytest.approx(1.0)
    assert result.timeline[-1][2] == pytest.approx(1.0)


def test_the_same_node_with_cpu_to_spare_strands_nothing() -> None:
    snaps = [build_profile("dgx1-v100", "a")]
    jobs = [job("j0", 1, 8000), job("j1", 1, 8000)]
    (policy,) = build_policies(["fgd"], snaps, jobs, {"a": (64000, None)})
    result = simulate(policy, snaps, jobs, "timed", time.perf_counter() + 30)
    assert result.started == 2 and result.first_failure_at is None
    assert _Meter(policy, snaps, jobs).fragmentation() == 0.0  # 6 GPUs free and usable
