"""Jobs that cannot start yet (--begin later, --dependency) are left to Slurm with
nothing reserved, and recorded on the GPUs Slurm gives them when they start (a real
slurmctld, job_submit.lua and cli_filter.lua)."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from tests.integrations.slurm.conftest import NODES
from tests.integrations.slurm.loopback import LoopbackCluster, Service
from tests.integrations.slurm.test_node_states import proposal
from tests.integrations.slurm.test_slurm_filter import (
    allocation_ids,
    env_value,
    eventually,
    gres_indices,
)
from tests.integrations.slurm.test_slurm_truth import held, of_job


def every_row(service: Service, job: str) -> list[dict[str, Any]]:
    with service.client() as client:
        rows: list[dict[str, Any]] = client.allocations(job_id=job)["allocations"]
    return rows


def test_a_job_that_may_begin_only_later_holds_nothing(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    node = NODES[2]
    later = cluster.sbatch("--gpus=8", "-w", node, "--begin=now+3600", script="sleep 60")
    jobs.append(later.id)
    assert later.returncode == 0, later.stderr
    shown = cluster.show_job(later.id)
    assert "Reason=BeginTime" in shown and "TresPerJob=gres:gpu:8" in shown
    assert not allocation_ids(shown) and every_row(service, later.id) == []
    # The node's GPUs are the others' meanwhile.
    assert proposal(service, tres_per_node="gres:gpu:8", req_nodes=node)["action"] == "modify"


def test_a_job_with_a_dependency_is_recorded_where_slurm_starts_it(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    first = cluster.sbatch("--gpus=1", "-w", NODES[0], script="sleep 4")
    jobs.append(first.id)
    assert first.returncode == 0, first.stderr
    assert allocation_ids(cluster.show_job(first.id))  # placed as usual
    after = cluster.sbatch("--gpus=2", f"--dependency=afterok:{first.id}", script="sleep 60")
    jobs.append(after.id)
    assert after.returncode == 0, after.stderr
    shown = cluster.show_job(after.id)
    assert "Reason=Dependency" in shown and not allocation_ids(shown)
    assert every_row(service, after.id) == []

    cluster.wait_state(after.id, ("RUNNING",), timeout_s=40)
    truth = gres_indices(cluster.show_job(after.id))
    assert sum(len(g) for g in truth.values()) == 2
    eventually(lambda: held(of_job(service, after.id)) == truth, "the job's GPUs recorded", 2)

    # srun through cli_filter.lua (its dependency met already): neither the client nor
    # job_submit.lua pins it; Slurm chooses, and its start is recorded.
    done = cluster.run(
        "srun",
        "--gpus=1",
        f"--dependency=afterok:{first.id}",
        "bash",
        "-c",
        "echo JOB=$SLURM_JOB_ID CVD=$CUDA_VISIBLE_DEVICES",
    )
    assert done.returncode == 0, done.stderr
    step = env_value(done.stdout, "JOB")
    jobs.append(step)
    shown = cluster.show_job(step)
    assert not allocation_ids(shown) and "TresPerJob=gres:gpu:1" in shown
    [recorded] = every_row(service, step)
    assert recorded["owner"] == "slurm:root"
    [task] = recorded["tasks"]
    assert [str(g) for g in task["gpu_indices"]] == env_value(done.stdout, "CVD").split(",")


def test_a_held_job_holds_nothing_and_is_recorded_where_slurm_starts_it_once_released(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    held_job = cluster.sbatch("--hold", "--gpus-per-node=2", "-w", NODES[1], script="sleep 60")
    jobs.append(held_job.id)
    assert held_job.returncode == 0, held_job.stderr
    shown = cluster.show_job(held_job.id)
    assert "Priority=0" in shown and not allocation_ids(shown), shown
    time.sleep(2)  # past the reconcile loop's next read: still nothing, not a release
    assert every_row(service, held_job.id) == []

    released = cluster.run("scontrol", "release", held_job.id)
    assert released.returncode == 0, released.stderr
    cluster.wait_state(held_job.id, ("RUNNING",), timeout_s=40)
    truth = gres_indices(cluster.show_job(held_job.id))
    assert list(truth) == [NODES[1]] and len(truth[NODES[1]]) == 2, truth
    eventually(lambda: held(of_job(service, held_job.id)) == truth, "the job's GPUs recorded", 2)


def test_srun_held_is_not_pinned_and_is_recorded_where_slurm_starts_it(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    """srun --hold through cli_filter.lua: nothing is named for it (it would run on GPUs
    no reservation holds); released, Slurm chooses and the start is recorded."""
    step = subprocess.Popen(
        ["srun", "--hold", "--gpus=1", "bash", "-c", "echo CVD=$CUDA_VISIBLE_DEVICES"],
        env=cluster.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pending: list[str] = []

        def submitted() -> bool:
            pending[:] = cluster.run("squeue", "-h", "-o", "%i", "-t", "PD").stdout.split()
            return len(pending) == 1

        eventually(submitted, "the held srun job in the queue", 10)
        [job] = pending
        jobs.append(job)
        shown = cluster.show_job(job)
        assert "Priority=0" in shown and "TresPerJob=gres:gpu:1" in shown, shown
        assert not allocation_ids(shown) and every_row(service, job) == []
        assert cluster.run("scontrol", "release", job).returncode == 0
        out, err = step.communicate(timeout=40)
    finally:
        if step.poll() is None:
            step.kill()
            step.communicate()
    assert step.returncode == 0, err
    [recorded] = every_row(service, job)
    [task] = recorded["tasks"]
    assert [str(g) for g in task["gpu_indices"]] == env_value(out, "CVD").split(",")
