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
    # One GPU in use on a node the filter chose: the pack policy's first pick after it.
    busy = cluster.sbatch("--gres=gpu:1", script="sleep 60")
    jobs.append(busy.id)
    assert busy.returncode == 0, busy.stderr
    cluster.wait_state(busy.id, ("RUNNING",))
    [busy_node] = gres_indices(cluster.show_job(busy.id))

    for argv in (["--exclusive", "--gpus=2"], ["--exclusive", "--gres=gpu:1"]):
        job = cluster.sbatch(*argv, script="sleep 60")
        jobs.append(job.id)
        assert job.returncode == 0, job.stderr
        cluster.wait_state(job.id, ("RUNNING",), timeout_s=10)  # not PD beside the busy one
        shown = cluster.show_job(job.id)
        assert not allocation_ids(shown), shown  # nothing to choose: left to Slurm
        truth = gres_indices(shown)
        [node] = truth
        assert node != busy_node and truth[node] == list(range(8)), truth
        recorded = partial(_holds, service, job.id, truth)
        eventually(recorded, "its 8 GPUs recorded", 2)
        cluster.run("scancel", job.id)
        cluster.wait_state(job.id, ("CANCELLED",))

    # srun through cli_filter.lua: proposed nowhere either, so it does not wait either.
    show = "scontrol -d show job -o $SLURM_JOB_ID"
    done = cluster.run("srun", "--exclusive", "--gres=gpu:1", "sh", "-c", show, timeout_s=20)
    assert done.returncode == 0, done.stderr
    [record] = [line for line in done.stdout.splitlines() if line.startswith("JobId=")]
    truth = gres_indices(record)
    assert busy_node not in truth and list(truth.values()) == [list(range(8))], record


def _holds(service: Service, job: str, truth: dict[str, list[int]]) -> bool:
    return held(of_job(service, job)) == truth


def test_a_job_in_an_exclusive_partition_runs_at_once_on_an_idle_node(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    """A partition with OverSubscribe=EXCLUSIVE gives every job whole nodes, as
    --exclusive does: pinned beside a running job, it waited there (PD Resources)."""
    busy = cluster.sbatch("--gres=gpu:1", script="sleep 60")
    jobs.append(busy.id)
    assert busy.returncode == 0, busy.stderr
    cluster.wait_state(busy.id, ("RUNNING",))
    [busy_node] = gres_indices(cluster.show_job(busy.id))

    job = cluster.sbatch("--partition=whole", "--gpus=2", script="sleep 60")
    jobs.append(job.id)
    assert job.returncode == 0, job.stderr
    cluster.wait_state(job.id, ("RUNNING",), timeout_s=10)  # not PD beside the busy one
    shown = cluster.show_job(job.id)
    assert not allocation_ids(shown), shown  # nothing to choose: left to Slurm
    truth = gres_indices(shown)
    [node] = truth
    assert node != busy_node and truth[node] == list(range(8)), truth
    eventually(partial(_holds, service, job.id, truth), "its 8 GPUs recorded", 2)
    cluster.run("scancel", job.id)
    cluster.wait_state(job.id, ("CANCELLED",))

    # srun through cli_filter.lua: proposed nowhere either, so it does not wait either.
    show = "scontrol -d show job -o $SLURM_JOB_ID"
    done = cluster.run("srun", "-p", "whole", "--gres=gpu:1", "sh", "-c", show, timeout_s=20)
    assert done.returncode == 0, done.stderr
    [record] = [line for line in done.stdout.splitlines() if line.startswith("JobId=")]
    truth = gres_indices(record)
    assert busy_node not in truth and list(truth.values()) == [list(range(8))], record
