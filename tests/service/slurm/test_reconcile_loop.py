"""The background reconcile step: runs the configured command, never releases on a failed read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.slurm import reconcile as reconcile_module
from service.slurm.fresh import FRESH
from service.slurm.reconcile import Reconciler
from service.slurm.settings import SlurmSettings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.slurm.squeue import live, running, tick_reading
from tests.service.slurm.test_truth import show_job


def _reconciler(client: TestClient, command: str) -> Reconciler:
    app: Any = client.app
    settings = SlurmSettings(squeue_command=command, reconcile_grace_s=0)
    return Reconciler(app.state.service, settings)


def _squeue(tmp_path: Path, jobs: list[dict[str, Any]]) -> str:
    """A command printing what `squeue --json` would."""
    output = tmp_path / "squeue.json"
    output.write_text(json.dumps({"jobs": jobs}))
    return f"cat {output}"


def test_a_failed_or_empty_read_releases_nothing(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "node1"))
    client.post("/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:1"})
    held = live(client)
    for command in ("false", "/nonexistent/squeue --json", "echo not-json"):
        asyncio.run(_reconciler(client, command).tick())
        assert live(client) == held


def test_the_configured_command_is_read_and_gone_jobs_are_released(
    client: TestClient, tmp_path: Path
) -> None:
    add_nodes(client, ("dgx1-v100", "node1"))
    kept = client.post("/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:1"}).json()
    gone = client.post("/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:1"}).json()
    alive = {"job_id": 1, "job_state": "RUNNING", "admin_comment": kept["set"]["admin_comment"]}
    asyncio.run(_reconciler(client, _squeue(tmp_path, [alive])).tick())
    assert live(client) == kept["allocation_ids"]
    assert gone["allocation_ids"][0] not in live(client)


def test_squeue_runs_are_timed_by_outcome(client: TestClient, tmp_path: Path) -> None:
    asyncio.run(_reconciler(client, _squeue(tmp_path, [])).tick())
    asyncio.run(_reconciler(client, "false").tick())
    asyncio.run(_reconciler(client, "false").tick())
    metrics = client.get("/metrics").text
    assert 'topoplace_squeue_duration_seconds_count{outcome="ok"} 1.0' in metrics
    assert 'topoplace_squeue_duration_seconds_count{outcome="failed"} 2.0' in metrics


@pytest.mark.parametrize("prolog", [False, True], ids=["pending", "started"])
def test_a_job_that_came_while_squeue_was_read_keeps_its_gpus(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, prolog: bool
) -> None:
    """squeue's answer is as old as its read's start: a job submitted (and started) after
    that is not in it, and its reservation must not be taken for an orphan, however long
    the read took (a busy slurmctld) and whether or not its prolog came meanwhile."""
    add_nodes(client, ("dgx1-v100", "node1"))
    made: list[str] = []

    async def slow_squeue(command: str, timeout_s: float) -> dict[str, Any]:
        clock.advance(2)  # slurmctld took its snapshot, then was slow to print it
        decision = client.post(
            "/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:2", "user_name": "alice"}
        ).json()
        made.extend(decision["allocation_ids"])
        if prolog:
            gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
            started = client.post(
                "/v1/slurm/job-started",
                json={
                    "show_job": show_job(21, gres, "node1", decision["set"]["admin_comment"]),
                    "job_name": "train",
                },
            )
            assert started.json()["action"] == "attached", started.text
        clock.advance(2)
        return {"jobs": []}

    tick_reading(client, monkeypatch, slow_squeue)
    assert made and live(client) == made, (
        "the reservation of a job newer than squeue's read was released"
    )


# What Slurm 22.05.8's `squeue --json` prints, exiting 0, when slurmctld does not answer.
UNREACHABLE = {
    "meta": {"plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"}},
    "errors": [
        {
            "description": "Failed while looking for jobs",
            "error_number": -1,
            "error": "Unspecified error",
            "source": "slurm_load_jobs",
        }
    ],
    "jobs": [],
}


def test_a_squeue_that_reports_errors_releases_nothing(
    client: TestClient, clock: FakeClock, tmp_path: Path
) -> None:
    """squeue exits 0 with an empty job list and an error when slurmctld does not answer:
    that is a failed read, not a cluster with no jobs."""
    add_nodes(client, ("dgx1-v100", "node1"))
    client.post("/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:1"})
    held = live(client)
    clock.advance(60)
    output = tmp_path / "squeue.json"
    output.write_text(json.dumps(UNREACHABLE))
    asyncio.run(_reconciler(client, f"cat {output}").tick())
    assert live(client) == held, "a squeue that could not reach slurmctld released GPUs"
    pushed = client.post("/v1/slurm/reconcile", json=UNREACHABLE)
    assert pushed.status_code == 400, pushed.text
    assert "slurm_load_jobs" in pushed.json()["error"]["message"]
    assert live(client) == held
    metrics = client.get("/metrics").text
    assert 'topoplace_squeue_duration_seconds_count{outcome="failed"} 1.0' in metrics


def test_a_job_that_ended_while_squeue_was_read_is_not_recorded_again(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squeue saw the job running; before its answer was used the job ended (its epilog
    released it) and its GPUs went to the next job. The old answer must not bring the
    ended job back over the next job's reservation."""
    add_nodes(client, ("dgx1-v100", "node1"))
    body = {"tres_per_node": "gres:gpu:8", "user_name": "alice"}
    first = client.post("/v1/slurm/job-submit", json=body).json()
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in range(8))
    comment = first["set"]["admin_comment"]
    report = {"show_job": show_job(5, gres, "node1", comment), "job_name": "train"}
    assert client.post("/v1/slurm/job-started", json=report).json()["action"] == "attached"
    was_running = running(5, comment, [gres])
    made: list[str] = []

    async def slow_squeue(command: str, timeout_s: float) -> dict[str, Any]:
        clock.advance(1)
        assert client.post("/v1/jobs/5/release").json()["released"]  # the epilog
        made.extend(client.post("/v1/slurm/job-submit", json=body).json()["allocation_ids"])
        clock.advance(1)
        return {"jobs": [was_running]}

    tick_reading(client, monkeypatch, slow_squeue)
    assert made and live(client) == made, "an ended job was recorded over the next job's GPUs"


def test_every_live_allocation_is_reconciled_however_many(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reconcile used to read at most 10,000 allocations a state, newest first: past
    that, the oldest orphans were never released. Read with a page of 2, three go."""
    add_nodes(client, ("dgx1-v100", "node1"))
    body = {"tres_per_node": "gres:gpu:1", "user_name": "alice"}
    orphans = [
        client.post("/v1/slurm/job-submit", json=body).json()["allocation_ids"][0] for _ in range(3)
    ]
    clock.advance(60)
    monkeypatch.setattr(reconcile_module, "_LISTED", 2, raising=False)
    app: Any = client.app
    result = reconcile_module.reconcile(app.state.service, SlurmSettings(), {"jobs": []})
    assert sorted(result.released) == sorted(orphans)
    assert live(client) == []


def test_a_job_requeued_and_restarted_while_squeue_was_read_keeps_its_record(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squeue saw the job's first run end (preempted); before its answer was used Slurm
    requeued the job and started it again, and the next run's prolog recorded it. The
    old answer must not end that record: the job runs on those GPUs."""
    add_nodes(client, ("dgx1-v100", "node1"))
    body = {"tres_per_node": "gres:gpu:2", "user_name": "alice"}
    decision = client.post("/v1/slurm/job-submit", json=body).json()
    comment = decision["set"]["admin_comment"]
    first = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
    report = {"show_job": show_job(7, first, "node1", comment), "job_name": "train"}
    assert client.post("/v1/slurm/job-started", json=report).json()["action"] == "attached"
    preempted = {"job_id": 7, "job_state": "PREEMPTED", "admin_comment": comment}
    recorded: list[str] = []

    async def slow_squeue(command: str, timeout_s: float) -> dict[str, Any]:
        clock.advance(1)
        assert client.post("/v1/jobs/7/release").json()["released"]  # the first run's epilog
        again = show_job(7, "gpu:g6:1(IDX:6),gpu:g7:1(IDX:7)", "node1", comment, restarts=1)
        answer = client.post("/v1/slurm/job-started", json={"show_job": again, "job_name": "train"})
        assert answer.json()["action"] == "created", answer.text
        recorded.append(answer.json()["allocation_id"])
        clock.advance(1)
        return {"jobs": [preempted]}

    tick_reading(client, monkeypatch, slow_squeue)
    assert recorded and live(client) == recorded, "the restarted run's record was ended"


def test_a_job_moved_by_a_newer_report_while_squeue_was_read_is_not_moved_back(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squeue saw the job's first run on its reserved GPUs; before its answer was used
    Slurm requeued the job (its epilog missed) and ran it on two others, whose prolog
    moved the job's allocation there, and the next job was given the GPUs it left. The
    old answer must not move the job back onto them, over the next job's reservation.
    Was: moved back, and the next job's reservation released as stale."""
    add_nodes(client, ("dgx1-v100", "node1"))
    body = {"tres_per_node": "gres:gpu:2", "user_name": "alice"}
    decision = client.post("/v1/slurm/job-submit", json=body).json()
    [allocation_id] = decision["allocation_ids"]
    comment = decision["set"]["admin_comment"]
    first = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
    report = {"show_job": show_job(8, first, "node1", comment), "job_name": "train"}
    assert client.post("/v1/slurm/job-started", json=report).json()["action"] == "attached"
    elsewhere = [g for g in range(8) if g not in decision["gpu_indices"]][-2:]
    running_first = running(8, comment, [first])
    made: list[str] = []

    async def slow_squeue(command: str, timeout_s: float) -> dict[str, Any]:
        clock.advance(1)
        again = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in elsewhere)
        text = show_job(8, again, "node1", comment, restarts=1)
        answer = client.post("/v1/slurm/job-started", json={"show_job": text, "job_name": "train"})
        assert answer.json()["action"] == "moved", answer.text
        pinned = {**body, "tres_per_node": "gres:gpu:6"}  # the six GPUs left: the first run's too
        made.extend(client.post("/v1/slurm/job-submit", json=pinned).json()["allocation_ids"])
        clock.advance(1)
        return {"jobs": [running_first]}

    tick_reading(client, monkeypatch, slow_squeue)
    held = client.get(f"/v1/allocations/{allocation_id}").json()
    assert sorted(g for t in held["tasks"] for g in t["gpu_indices"]) == elsewhere, held
    assert made and sorted(live(client)) == sorted([allocation_id, *made]), (
        "the next job's reservation was released for a stale answer"
    )


def test_without_a_command_the_notes_of_fresh_reservations_are_not_kept(
    client: TestClient,
) -> None:
    """Where squeue is pushed (no TOPOPLACE_SLURM_SQUEUE_COMMAND) no loop runs early for
    a fresh reservation: the filter's note of each one was kept for good (a float a job,
    for as long as the service ran), the loop's step returning before it read them."""
    add_nodes(client, ("dgx1-v100", "node1"))
    for _ in range(3):
        client.post("/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:1"})
    asyncio.run(_reconciler(client, "").tick())
    assert not FRESH.due(0)
