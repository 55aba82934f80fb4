"""A job with --exclusive gets every GPU of its node from Slurm, whatever it asked for
(a real slurmctld: `CUDA_VISIBLE_DEVICES=0,...,7` for `--exclusive --gpus=2`), and
needs a node no other job uses: pinned by the filter next to a running job, it waited
there while other nodes sat idle."""

from __future__ import annotations

from functools import partial

from tests.integrations.slurm.loopback import LoopbackCluster, Service
from tests.integrations.slurm.test_slurm_filter import allocation_ids, eventually, gres_indices
from tests.integrations.slurm.test_slurm_truth import held, of_job


def test_an_exclusive_job_runs_at_once_on_an_idle_node_and_is_recorded_whole(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    busy_node = _one_gpu_busy(cluster, jobs)
    for argv in (["--exclusive", "--gpus=2"], ["--exclusive", "--gres=gpu:1"]):
        _runs_whole_elsewhere(cluster, service, jobs, argv, busy_node)
    # srun through cli_filter.lua: proposed nowhere either, so it does not wait either.
    _srun_runs_whole_elsewhere(cluster, ["--exclusive", "--gres=gpu:1"], busy_node)


def test_a_job_in_an_exclusive_partition_runs_at_once_on_an_idle_node(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    """A partition with OverSubscribe=EXCLUSIVE gives every job whole nodes, as
    --exclusive does: pinned beside a running job, it waited there (PD Resources)."""
    busy_node = _one_gpu_busy(cluster, jobs)
    _runs_whole_elsewhere(cluster, service, jobs, ["--partition=whole", "--gpus=2"], busy_node)
    _srun_runs_whole_elsewhere(cluster, ["-p", "whole", "--gres=gpu:1"], busy_node)


def _one_gpu_busy(cluster: LoopbackCluster, jobs: list[str]) -> str:
    """One GPU in use on a node the filter chose (the pack policy's first pick after it
    is beside it): that node."""
    busy = cluster.sbatch("--gres=gpu:1", script="sleep 60")
    jobs.append(busy.id)
    assert busy.returncode == 0, busy.stderr
    cluster.wait_state(busy.id, ("RUNNING",))
    [busy_node] = gres_indices(cluster.show_job(busy.id))
    return busy_node


def _runs_whole_elsewhere(
    cluster: LoopbackCluster, service: Service, jobs: list[str], argv: list[str], busy: str
) -> None:
    """The job runs at once on a node other than ``busy``, on all its 8 GPUs, left to
    Slurm by the filter and recorded by the service within 2 s; then it is cancelled."""
    job = cluster.sbatch(*argv, script="sleep 60")
    jobs.append(job.id)
    assert job.returncode == 0, job.stderr
    cluster.wait_state(job.id, ("RUNNING",), timeout_s=10)  # not PD beside the busy one
    shown = cluster.show_job(job.id)
    assert not allocation_ids(shown), shown  # nothing to choose: left to Slurm
    truth = gres_indices(shown)
    [node] = truth
    assert node != busy and truth[node] == list(range(8)), truth
    eventually(partial(_holds, service, job.id, truth), "its 8 GPUs recorded", 2)
    cluster.run("scancel", job.id)
    cluster.wait_state(job.id, ("CANCELLED",))


def _srun_runs_whole_elsewhere(cluster: LoopbackCluster, argv: list[str], busy: str) -> None:
    show = "scontrol -d show job -o $SLURM_JOB_ID"
    done = cluster.run("srun", *argv, "sh", "-c", show, timeout_s=20)
    assert done.returncode == 0, done.stderr
    [record] = [line for line in done.stdout.splitlines() if line.startswith("JobId=")]
    truth = gres_indices(record)
    assert busy not in truth and list(truth.values()) == [list(range(8))], record


def _holds(service: Service, job: str, truth: dict[str, list[int]]) -> bool:
    return held(of_job(service, job)) == truth
