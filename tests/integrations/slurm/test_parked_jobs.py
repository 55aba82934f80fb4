"""A held job gives its GPUs back to the others, and is recorded where it runs once
released (a real slurmctld: `scontrol hold`, `scontrol release`)."""

from __future__ import annotations

from tests.integrations.slurm.conftest import INTERVAL_S, NODES
from tests.integrations.slurm.loopback import Job, LoopbackCluster, Service
from tests.integrations.slurm.test_slurm_filter import (
    allocation,
    allocation_ids,
    eventually,
    gres_indices,
)
from tests.integrations.slurm.test_slurm_truth import every_cpu, held, of_job


def test_a_held_job_frees_its_gpus_and_is_recorded_when_it_starts(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    """Held after the filter reserved for it: a job submitted held (`--hold`) is left to
    Slurm unreserved from the start (test_deferred_jobs.py), so this one waits for
    Resources behind a job that has every CPU of the node, then `scontrol hold`."""
    node = NODES[2]
    whole, parked, reserved = _pinned_behind_a_full_node(cluster, node, jobs)
    held_now = cluster.run("scontrol", "hold", parked.id)
    assert held_now.returncode == 0, held_now.stderr
    assert "Reason=JobHeld" in cluster.show_job(parked.id)  # User, or Admin for root
    eventually(
        lambda: allocation(service, reserved)["state"] == "released",
        "the held job's reservation released",
        INTERVAL_S + 0.5,
    )
    cluster.run("scancel", whole)
    cluster.wait_state(whole, ("CANCELLED", "COMPLETED"))
    # Its GPUs are the others': another job is placed on the node at once.
    other = cluster.sbatch("--gpus=2", "-w", node, script="sleep 60")
    jobs.append(other.id)
    assert other.returncode == 0, other.stderr
    assert allocation_ids(cluster.show_job(other.id)), "the node's GPUs were still held"
    cluster.wait_state(other.id, ("RUNNING",))
    assert of_job(service, parked.id) == []

    cluster.run("scancel", other.id)
    cluster.wait_state(other.id, ("CANCELLED", "COMPLETED"))
    released = cluster.run("scontrol", "release", parked.id)
    assert released.returncode == 0, released.stderr
    cluster.wait_state(parked.id, ("RUNNING",), timeout_s=30)
    truth = gres_indices(cluster.show_job(parked.id))
    assert truth == {node: list(range(8))}
    eventually(lambda: held(of_job(service, parked.id)) == truth, "the job's GPUs recorded", 2)
    [recorded] = of_job(service, parked.id)
    assert recorded["id"] != reserved and recorded["owner"] == "slurm:root"


def test_a_job_pinned_to_a_node_reserved_after_it_gives_its_gpus_back(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    """An advance reservation made on a node after the filter pinned a job there: Slurm
    starts the job only once the reservation is over (`ReqNodeNotAvail, May be reserved
    for other job`), so its reservation went on keeping 8 GPUs from every other job."""
    node = NODES[2]
    whole, pinned, reserved = _pinned_behind_a_full_node(cluster, node, jobs)
    name = f"later{pinned.id}"
    created = cluster.run(
        "scontrol",
        "create",
        "reservation",
        f"reservationname={name}",
        f"nodes={node}",
        "users=root",
        "starttime=now+60minutes",
        "duration=10",
        "flags=ignore_jobs",  # the node's running job has no time limit
    )
    assert created.returncode == 0, created.stderr
    try:
        cluster.run("scancel", whole)  # its GPUs and CPUs free: only the reservation blocks it
        cluster.wait_state(whole, ("CANCELLED", "COMPLETED"))
        eventually(
            lambda: "May_be_reserved_for_other_job" in cluster.show_job(pinned.id),
            "the job blocked by the reservation",
            INTERVAL_S,
        )
        eventually(
            lambda: allocation(service, reserved)["state"] == "released",
            "the blocked job's reservation released",
            INTERVAL_S + 0.5,
        )
        assert cluster.job_state(pinned.id) == "PENDING"
    finally:
        cluster.run("scancel", pinned.id)
        cluster.wait_state(pinned.id, ("CANCELLED",))
        deleted = cluster.run("scontrol", "delete", f"reservationname={name}")
        assert deleted.returncode == 0, deleted.stderr


def _pinned_behind_a_full_node(
    cluster: LoopbackCluster, node: str, jobs: list[str]
) -> tuple[str, Job, str]:
    """A job with every CPU of ``node``, then an 8-GPU job the filter pins there, waiting
    behind it: the first job, the pinned one and the pinned one's allocation id."""
    whole = every_cpu(cluster, node, jobs)
    pinned = cluster.sbatch("--gpus=8", "-w", node, script="sleep 60")
    jobs.append(pinned.id)
    assert pinned.returncode == 0, pinned.stderr
    [reserved] = allocation_ids(cluster.show_job(pinned.id))  # the filter placed it
    return whole, pinned, reserved
