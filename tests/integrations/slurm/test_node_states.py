"""A node Slurm drains gets no job from the filter (a real slurmctld, sinfo read by
the service every second)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.integrations.slurm.loopback import LoopbackCluster, Service
from tests.integrations.slurm.test_slurm_filter import allocation_ids, eventually, gres_indices


def proposal(service: Service, **fields: Any) -> dict[str, Any]:
    """What the filter would choose now (cli_filter.lua's question: nothing is held)."""
    answer = httpx.post(
        f"{service.url}/v1/slurm/job-submit?propose=true",
        json={"batch": False, "reserve": False, **fields},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text
    decision: dict[str, Any] = answer.json()
    return decision


def test_a_drained_node_gets_no_job(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    [chosen] = proposal(service, tres_per_node="gres:gpu:8")["nodes"]  # on idle nodes
    drained = cluster.run(
        "scontrol", "update", f"nodename={chosen}", "state=drain", "reason=disk check"
    )
    assert drained.returncode == 0, drained.stderr
    try:
        since = time.monotonic()
        eventually(
            lambda: proposal(service, tres_per_node="gres:gpu:8")["nodes"] != [chosen],
            "the drain seen by the service",
            5,
        )
        seen_s = time.monotonic() - since
        assert seen_s < 2.5, seen_s  # within about one read (1 s) on a busy machine
        job = cluster.sbatch("--gpus=8", script="sleep 60")
        jobs.append(job.id)
        assert job.returncode == 0, job.stderr
        assert allocation_ids(cluster.show_job(job.id)), "the job was not placed"
        cluster.wait_state(job.id, ("RUNNING",))  # at once: not pinned to the drained node
        [node] = gres_indices(cluster.show_job(job.id))
        assert node != chosen

        # Named onto it, a job is left to Slurm and holds nothing while it waits there.
        named = cluster.sbatch("--gpus=1", "-w", chosen, script="sleep 60")
        jobs.append(named.id)
        assert named.returncode == 0, named.stderr
        shown = cluster.show_job(named.id)
        assert not allocation_ids(shown) and "JobState=PENDING" in shown
        cluster.run("scancel", named.id)
    finally:
        cluster.run("scontrol", "update", f"nodename={chosen}", "state=resume")
    eventually(
        lambda: (
            proposal(service, tres_per_node="gres:gpu:1", req_nodes=chosen)["action"] == "modify"
        ),
        "the node back in the service's choices",
        5,
    )


def test_a_reserved_node_gets_only_the_jobs_of_its_reservation(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    """An advance reservation (`scontrol create reservation`): Slurm starts there only
    the jobs that name it. Pinned there, a job without it waited (ReqNodeNotAvail, May
    be reserved for other job) while other nodes sat idle; pinned elsewhere, a job
    naming it was refused at submission (Requested node configuration is not
    available)."""
    [chosen] = proposal(service, tres_per_node="gres:gpu:8")["nodes"]  # on idle nodes
    name = f"r{chosen}"
    created = cluster.run(
        "scontrol",
        "create",
        "reservation",
        f"reservationname={name}",
        f"nodes={chosen}",
        "users=root",
        "starttime=now",
        "duration=10",
    )
    assert created.returncode == 0, created.stderr
    try:
        # slurmctld flags the node RESERVED in sinfo a while after the reservation starts
        # (0-30 s seen); the service follows sinfo within about a read.
        eventually(lambda: "RESERVED" in _flags(cluster, chosen), "the node flagged", 60)
        eventually(
            lambda: proposal(service, tres_per_node="gres:gpu:8")["nodes"] != [chosen],
            "the reservation seen by the service",
            2.5,
        )
        job = cluster.sbatch("--gpus=8", script="sleep 60")
        jobs.append(job.id)
        assert job.returncode == 0, job.stderr
        cluster.wait_state(job.id, ("RUNNING",), timeout_s=10)  # at once, elsewhere
        assert list(gres_indices(cluster.show_job(job.id))) != [chosen]

        # Naming it, a job is left to Slurm, which starts it there; its prolog records it.
        named = cluster.sbatch(f"--reservation={name}", "--gpus=1", script="sleep 60")
        jobs.append(named.id)
        assert named.returncode == 0, named.stderr
        cluster.wait_state(named.id, ("RUNNING",), timeout_s=10)
        shown = cluster.show_job(named.id)
        assert not allocation_ids(shown) and list(gres_indices(shown)) == [chosen], shown
    finally:
        cluster.run("scancel", *jobs)
        for started in jobs:
            cluster.wait_state(started, ("CANCELLED", "COMPLETED"))
        deleted = cluster.run("scontrol", "delete", f"reservationname={name}")
        assert deleted.returncode == 0, deleted.stderr
    eventually(
        lambda: (
            proposal(service, tres_per_node="gres:gpu:1", req_nodes=chosen)["action"] == "modify"
        ),
        "the node back in the service's choices",
        5,
    )


def _flags(cluster: LoopbackCluster, node: str) -> list[str]:
    nodes = json.loads(cluster.run("sinfo", "--json").stdout)["nodes"]
    return [str(f) for n in nodes if n["name"] == node for f in n.get("state_flags", [])]
