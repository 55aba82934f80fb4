"""topoplace in front of a real slurmctld: sbatch/srun on a loopback cluster.

Three DGX-1 nodes (8 fake GPUs each, two fully connected NVLink quads joined
by single links), gres.conf and node lines written by `topoplace slurm`, the
service on loopback, job_submit.lua, cli_filter.lua and the epilog.
"""

from __future__ import annotations

import itertools
import re
import socket
import sqlite3
from collections.abc import Callable
from contextlib import closing
from typing import Any

import pytest

from placement import bandwidth_matrix
from placement.profiles import build_profile
from slurm_formats.hostlist import expand
from tests.integrations.slurm.conftest import NODES, PROFILE
from tests.integrations.slurm.loopback import LoopbackCluster, Service, free_port
from tests.slurm_cron import documented_cron_command
from tests.waiting import wait_until
from topoplace_client.api import ApiError

BANDWIDTH = bandwidth_matrix(build_profile(PROFILE, "any"))


def ring_gbps(gpus: list[int]) -> float:
    """The best all-reduce ring through these GPUs: brute force over cyclic orders."""
    if len(gpus) < 2:
        return 0.0
    first, rest = gpus[0], gpus[1:]
    best = 0.0
    for order in itertools.permutations(rest):
        cycle = [first, *order, first]
        best = max(best, min(float(BANDWIDTH[a][b]) for a, b in itertools.pairwise(cycle)))
    return best


def env_value(text: str, name: str) -> str:
    match = re.search(rf"\b{name}=(\S*)", text)
    assert match is not None, f"{name} not in {text!r}"
    return match.group(1)


def gres_indices(show_job: str) -> dict[str, list[int]]:
    """Per node, the GPU indices `scontrol -d show job` says the job holds."""
    held: dict[str, list[int]] = {}
    for node, gres in re.findall(r"Nodes=(\S+) CPU_IDs=\S+ Mem=\S+ GRES=(\S*)", show_job):
        for name in expand(node):  # nodes holding the same GPUs share a line: node[1-2]
            held[name] = sorted(int(i) for i in re.findall(r"\(IDX:(\d+)\)", gres))
    return held


def allocation_ids(show_job: str) -> list[str]:
    match = re.search(r"AdminComment=topoplace alloc=(\S+)", show_job)
    return match.group(1).split(",") if match else []


def eventually(check: Callable[[], bool], what: str, timeout_s: float = 15) -> None:
    wait_until(check, what, timeout_s=timeout_s, interval_s=0.2)


def allocation(service: Service, allocation_id: str) -> dict[str, Any]:
    with service.client() as client:
        return client.allocation(allocation_id)


def test_four_gpu_job_runs_on_the_gpus_the_service_chose(
    cluster: LoopbackCluster, service: Service, jobs: list[str], slurm_alone: LoopbackCluster
) -> None:
    fillers = [cluster.sbatch("--gpus=1", "-w", "node1"), cluster.sbatch("--gpus=2", "-w", "node1")]
    jobs += [f.id for f in fillers]
    busy: list[int] = []
    for filler in fillers:
        assert filler.returncode == 0, filler.stderr
        cluster.wait_state(filler.id, ("RUNNING",))
        busy += gres_indices(cluster.show_job(filler.id))["node1"]

    job = cluster.sbatch(
        "--gpus=4",
        "-w",
        "node1",
        script="echo CVD=$CUDA_VISIBLE_DEVICES JOB_GPUS=$SLURM_JOB_GPUS"
        " ALLOC=$TOPOPLACE_ALLOCATION_ID; sleep 30",
    )
    jobs.append(job.id)
    assert job.returncode == 0, job.stderr
    printed = cluster.wait_output(job.id, "CVD=")
    shown = cluster.show_job(job.id)
    [allocation_id] = allocation_ids(shown)
    placed = allocation(service, allocation_id)
    [task] = placed["tasks"]
    chosen = task["gpu_indices"]
    visible = ",".join(str(g) for g in chosen)

    assert task["node"] == "node1" and len(chosen) == 4 and not set(chosen) & set(busy)
    assert env_value(printed, "CVD") == visible
    assert env_value(printed, "JOB_GPUS") == visible
    assert env_value(printed, "ALLOC") == allocation_id
    assert gres_indices(shown) == {"node1": chosen}
    assert task["nvlink_connected"] and task["islands"] == ["nvl0"]
    assert placed["ring_gbps"] == pytest.approx(ring_gbps(chosen))
    assert placed["state"] == "active"

    # The same state without the filter: the same GPUs busy, Slurm chooses alone.
    pins = [
        ",".join(f"gpu:g{g}:1" for g in gres_indices(cluster.show_job(f.id))["node1"])
        for f in fillers
    ]
    alone = [slurm_alone.sbatch(f"--gres={pin}") for pin in pins]
    for pinned in alone:
        assert pinned.returncode == 0, pinned.stderr
        slurm_alone.wait_state(pinned.id, ("RUNNING",))
    slurm_job = slurm_alone.sbatch("--gpus=4", script="echo CVD=$CUDA_VISIBLE_DEVICES; sleep 30")
    cvd = env_value(slurm_alone.wait_output(slurm_job.id, "CVD="), "CVD")
    slurm_choice = [int(g) for g in cvd.split(",")]
    assert sorted(
        g for f in alone for g in gres_indices(slurm_alone.show_job(f.id))["solo1"]
    ) == sorted(busy)
    assert ring_gbps(chosen) >= ring_gbps(slurm_choice)
    print(
        f"busy {sorted(busy)}: topoplace {chosen} ring {ring_gbps(chosen):g} GB/s;"
        f" Slurm alone {slurm_choice} ring {ring_gbps(slurm_choice):g} GB/s"
    )


def test_a_request_that_can_never_fit_is_refused_with_the_service_message(
    cluster: LoopbackCluster, service: Service
) -> None:
    refused = cluster.sbatch("--gpus=16", "--comment=topoplace:locality=nvlink", script="true")
    assert refused.returncode != 0
    # The engine's own words for the refusal, as /v1/place gives them, reach the user.
    with service.client() as client, pytest.raises(ApiError) as engine:
        client.place({"gpus": 16, "locality": "nvlink", "nodes": list(NODES)})
    assert engine.value.message in refused.stderr
    assert "the cluster can never hold this request" in refused.stderr
    assert "has 16 GPUs; the largest has 8" in refused.stderr  # said of the cluster, not per node

    array = cluster.sbatch("--gpus=1", "--array=0-1", "-w", "node3", "--hold", script="true")
    assert array.returncode == 0, array.stderr
    assert not allocation_ids(cluster.show_job(array.id))  # arrays are left to Slurm
    cluster.run("scancel", array.id)

    typo = cluster.sbatch("--gpus=1", "--comment=topoplace:locality=nvlnk", script="true")
    assert typo.returncode != 0 and "locality='nvlnk' is not one of" in typo.stderr


def _unchanged_submission(cluster: LoopbackCluster, jobs: list[str]) -> float:
    job = cluster.sbatch("--gpus=2", "-w", "node3", script="true")
    assert job.returncode == 0, job.stderr
    jobs.append(job.id)
    shown = cluster.show_job(job.id)
    assert "TresPerJob=gres:gpu:2" in shown
    assert not allocation_ids(shown)
    return job.seconds


def test_sbatch_goes_through_unchanged_when_the_service_is_down_or_hung(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    log = cluster.root / "log" / "slurmctld.log"
    try:
        cluster.write_filter_config(f"http://127.0.0.1:{free_port()}")  # nothing listens
        refused_s = _unchanged_submission(cluster, jobs)
        assert "topoplace: no answer (connection refused" in log.read_text()

        with socket.socket() as hung:  # accepts connections (backlog), never answers
            hung.bind(("127.0.0.1", 0))
            hung.listen(16)
            cluster.write_filter_config(f"http://127.0.0.1:{hung.getsockname()[1]}")
            hung_s = _unchanged_submission(cluster, jobs)
        assert "topoplace: no answer (timeout after" in log.read_text()
    finally:
        cluster.write_filter_config(service.url)
    # The filter waits at most its 100 ms timeout; sbatch itself takes tens of ms.
    assert refused_s < 1.0 and hung_s < 1.0, (refused_s, hung_s)


def test_the_epilog_releases_the_allocation_when_the_job_ends(
    cluster: LoopbackCluster, service: Service
) -> None:
    job = cluster.sbatch("--gpus=2", "-w", "node2", "--constraint=gpu_v100&nvlink", script="true")
    assert job.returncode == 0, job.stderr
    [allocation_id] = allocation_ids(cluster.show_job(job.id))
    cluster.wait_state(job.id, ("COMPLETED",))
    eventually(
        lambda: allocation(service, allocation_id)["state"] == "released", "release by the epilog"
    )
    assert (
        f"allocation {allocation_id} released: True"
        in (cluster.root / "log" / "epilog.log").read_text()
    )


def test_a_job_whose_epilog_never_ran_is_reconciled(
    cluster: LoopbackCluster, service: Service
) -> None:
    marker = cluster.root / "epilog-off"
    marker.touch()
    try:
        job = cluster.sbatch("--gpus=1", "-w", "node2")
        assert job.returncode == 0, job.stderr
        [allocation_id] = allocation_ids(cluster.show_job(job.id))
        cluster.wait_state(job.id, ("RUNNING",))
        # A reconcile round on what squeue says while the job runs, pushed now rather
        # than awaited from the loop's clock, by docs/slurm.md's crontab line (real
        # squeue, date, curl and /bin/sh): the job's allocation must stay held.
        headers = cluster.root / "reconcile.headers"
        headers.write_text("X-Pushed-By: cron\n")  # this service takes no token
        push = cluster.run("/bin/sh", "-c", documented_cron_command(service.url, headers))
        assert push.returncode == 0, push.stderr
        assert allocation(service, allocation_id)["state"] == "active"
        cluster.run("scancel", job.id)
        cluster.wait_state(job.id, ("CANCELLED",))
        eventually(
            lambda: allocation(service, allocation_id)["state"] == "released",
            "release by the reconcile loop",
        )
    finally:
        marker.unlink()
    epilog_log = cluster.root / "log" / "epilog.log"
    assert allocation_id not in (epilog_log.read_text() if epilog_log.exists() else "")


def test_a_multi_node_job_gets_the_same_gpus_on_every_node(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    job = cluster.sbatch(
        "--gpus-per-node=4", "-N2", script="echo CVD=$CUDA_VISIBLE_DEVICES; sleep 30"
    )
    jobs.append(job.id)
    assert job.returncode == 0, job.stderr
    cluster.wait_output(job.id, "CVD=")
    shown = cluster.show_job(job.id)
    ids = allocation_ids(shown)
    placed = [allocation(service, i) for i in ids]
    by_node = {t["node"]: t["gpu_indices"] for a in placed for t in a["tasks"]}
    held = gres_indices(shown)
    assert len(by_node) == 2 and len({tuple(g) for g in by_node.values()}) == 1
    assert held == by_node
    first = next(iter(by_node.values()))
    assert env_value(cluster.output(job.id), "CVD") == ",".join(str(g) for g in first)


def test_srun_gets_the_gpus_the_service_chose(cluster: LoopbackCluster, service: Service) -> None:
    done = cluster.run(
        "srun",
        "--gpus=2",
        "-w",
        "node3",
        "sh",
        "-c",
        "echo CVD=$CUDA_VISIBLE_DEVICES JOB=$SLURM_JOB_ID",
    )
    assert done.returncode == 0, done.stderr
    shown = cluster.show_job(env_value(done.stdout, "JOB"))
    [allocation_id] = allocation_ids(shown)
    [task] = allocation(service, allocation_id)["tasks"]
    assert env_value(done.stdout, "CVD") == ",".join(str(g) for g in task["gpu_indices"])


def reservation_keys(service: Service, allocation_ids: list[str]) -> list[str]:
    """The Idempotency-Keys the service stored these reservations under."""
    with closing(sqlite3.connect(service.root / "topoplace.sqlite3")) as db:
        marks = ",".join("?" * len(allocation_ids))
        query = f"SELECT idempotency_key FROM allocations WHERE id IN ({marks})"
        return [str(key) for (key,) in db.execute(query, allocation_ids)]


def test_a_connection_the_service_closed_while_idle_is_replaced_reserving_once(
    cluster: LoopbackCluster, service: Service, jobs: list[str]
) -> None:
    """job_submit.lua keeps its connection between jobs; after the service closes it
    (uvicorn drops connections idle for 5 s) the next job is sent again on a new one,
    and reserved exactly once."""
    # Running jobs: a held one gives its reservation back (test_parked_jobs.py).
    first = cluster.sbatch("--gpus=1", script="sleep 60")
    jobs.append(first.id)
    assert first.returncode == 0, first.stderr
    port = int(service.url.rsplit(":", 1)[1])
    assert cluster.connections("slurmctld", port) >= 1, "job_submit.lua keeps its connection"
    # Not a sleep past uvicorn's 5 s: the moment the service has closed it, however
    # long a loaded machine takes to get there.
    eventually(lambda: not cluster.connections("slurmctld", port), "the idle one closed", 30)
    with service.client() as client:
        before = {a["id"] for a in client.allocations(state="active")["allocations"]}
    second = cluster.sbatch("--gpus=1", script="sleep 60")
    jobs.append(second.id)
    assert second.returncode == 0, second.stderr
    placed = allocation_ids(cluster.show_job(second.id))
    with service.client() as client:
        after = {a["id"] for a in client.allocations(state="active")["allocations"]}
        assert after - before == set(placed) and len(placed) == 1
    # Each submission under a key of its own, which a resend would carry again.
    keys = reservation_keys(service, allocation_ids(cluster.show_job(first.id)) + placed)
    assert len(set(keys)) == 2 and all(k.startswith("slurm-") for k in keys), keys
    with service.client() as client:
        for allocation_id in allocation_ids(cluster.show_job(first.id)) + placed:
            client.release(allocation_id)
