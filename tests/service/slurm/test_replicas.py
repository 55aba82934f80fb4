"""Two service processes on one Postgres: one replica's reconcile loop, whose squeue
answer is older than what the other replica did meanwhile, releases none of it.

Real processes (`topoplace serve`), real Postgres. The reading replica's squeue is a
script that waits at a gate per call (files the test creates), so the other
replica's writes land between squeue's answer and its use, every time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from placement.profiles import build_profile
from tests.service import replica_processes
from tests.service.conftest import _truncate
from tests.service.slurm.test_truth import show_job

COMMON = {"TOPOPLACE_HEARTBEAT_TTL_S": "3600", "TOPOPLACE_SLURM_RECONCILE_GRACE_S": "0.5"}


def _wait_for(path: Path, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > end:
            raise AssertionError(f"{path.name} never appeared")
        time.sleep(0.05)


def _gated_squeue(gates: Path) -> Path:
    """A squeue that, on its Nth call, creates askedN, waits for gateN, prints no job."""
    script = gates / "squeue"
    script.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{gates}/calls"\n'
        f'n=$(wc -l < "{gates}/calls")\n'
        f'touch "{gates}/asked$n"\n'
        f'while [ ! -e "{gates}/gate$n" ]; do sleep 0.05; done\n'
        "echo '{\"jobs\": []}'\n"
    )
    script.chmod(0o755)
    return script


@pytest.fixture
def gates(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    for n in range(1, 10):  # let every squeue still waiting end
        (tmp_path / f"gate{n}").touch()


@pytest.fixture
def reader_and_filter(postgres_url: str, gates: Path) -> Iterator[tuple[str, str]]:
    """(a replica whose loop reads the gated squeue every second, one without a loop)."""
    _truncate(postgres_url)
    reader_env = {
        **COMMON,
        "TOPOPLACE_SLURM_SQUEUE_COMMAND": str(_gated_squeue(gates)),
        "TOPOPLACE_SLURM_RECONCILE_INTERVAL_S": "1",
    }
    started = [
        replica_processes.start(postgres_url, reader_env),
        replica_processes.start(postgres_url, {**COMMON, "TOPOPLACE_SLURM_SQUEUE_COMMAND": "off"}),
    ]
    try:
        for url, proc in started:
            replica_processes.wait_ready(url, proc)
        yield started[0][0], started[1][0]
    finally:
        for _, proc in started:
            replica_processes.stop(proc)


def test_a_job_started_on_one_replica_while_the_other_read_squeue_keeps_its_gpus(
    reader_and_filter: tuple[str, str], gates: Path
) -> None:
    reader, other = reader_and_filter
    _wait_for(gates / "asked1")  # the reader asked squeue: its answer is as of now
    snap = build_profile("dgx1-v100", "node1")
    with httpx.Client(base_url=other, trust_env=False, timeout=10) as client:
        put = client.put(
            "/v1/nodes/node1/snapshot", json={"snapshot": snap.model_dump(mode="json")}
        )
        assert put.status_code == 200, put.text
        body = {"tres_per_node": "gres:gpu:2", "user_name": "alice"}
        decision = client.post("/v1/slurm/job-submit", json=body).json()
        [allocation_id] = decision["allocation_ids"]
        gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
        text = show_job(100, gres, "node1", decision["set"]["admin_comment"])
        report = client.post("/v1/slurm/job-started", json={"show_job": text, "job_name": "train"})
        assert report.json()["action"] == "attached", report.text
    (gates / "gate1").touch()  # squeue answers: no job 100 in it
    _wait_for(gates / "asked2")  # the reader's next round began: the first one is done
    with httpx.Client(base_url=reader, trust_env=False, timeout=10) as client:
        held = client.get(f"/v1/allocations/{allocation_id}").json()
    assert held["state"] == "active", "a replica released a job newer than its squeue answer"
