"""An squeue answer older than a prolog's report releases nothing that report used.

squeue's answer is as old as its read's start; the loop's read can take seconds on a
busy slurmctld, and a pushed one arrives later still. Between the read and the
reconcile a prolog can report a job's start on an allocation the answer saw ended
(a finished job requeued, its epilog missed) or named by no job (a reservation a job
took): the answer is older than that report, and releasing on it would free GPUs a
live job runs on for the filter to give to another (docs/slurm.md, "Stale answers").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.allocations import ended_jobs
from tests.service.conftest import FakeClock
from tests.service.slurm.squeue import live, pending, running, tick_reading
from tests.service.slurm.test_truth import gpus, of_job, show_job, started, submit

EVERY_GPU = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in range(8))


def _typed(indices: list[int]) -> str:
    return ",".join(f"gpu:g{g}:1(IDX:{g})" for g in indices)


def _completed(job: int, comment: str) -> dict[str, Any]:
    return {"job_id": job, "job_state": "COMPLETED", "user_name": "alice", "admin_comment": comment}


def _running_job(client: TestClient, job: int) -> tuple[dict[str, Any], str]:
    """A placed job running where reserved (its prolog reported): (its decision, its
    per-GPU gres as Slurm prints it)."""
    decision = submit(client, tres_per_node="gres:gpu:2", req_nodes="node1")
    pinned = _typed(decision["gpu_indices"])
    text = show_job(job, pinned, "node1", decision["set"]["admin_comment"])
    assert started(client, text)["action"] == "attached"
    return decision, pinned


def _next_run_gres(decision: dict[str, Any], moved: bool) -> str:
    """The GPUs the requeued job's next run gets: the same, or two others on node1."""
    if not moved:
        return _typed(decision["gpu_indices"])
    return _typed([g for g in range(8) if g not in decision["gpu_indices"]][:2])


@pytest.mark.parametrize("moved", [False, True], ids=["same-gpus", "other-gpus"])
def test_a_finished_answer_read_before_a_requeued_run_started_releases_nothing(
    dgx1: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, moved: bool
) -> None:
    """Job 90 completed (its epilog missed), and squeue's snapshot shows it so; while the
    read is printed the job is requeued and starts again, its prolog reporting the run.
    The answer is older than that run: the job's allocation stays."""
    decision, _ = _running_job(dgx1, 90)
    comment = decision["set"]["admin_comment"]
    gres = _next_run_gres(decision, moved)

    async def slow_squeue(command: str, timeout_s: float) -> dict[str, Any]:
        clock.advance(2)  # slurmctld took its snapshot: job 90 completed
        again = started(dgx1, show_job(90, gres, "node1", comment, restarts=1))
        assert again["action"] == ("moved" if moved else "matched"), again
        clock.advance(2)
        return {"jobs": [_completed(90, comment)]}

    tick_reading(dgx1, monkeypatch, slow_squeue)
    [allocation] = of_job(dgx1, 90)
    assert allocation["id"] == decision["allocation_ids"][0], "the requeued run's GPUs were freed"


@pytest.mark.parametrize("moved", [False, True], ids=["same-gpus", "other-gpus"])
def test_a_pushed_finished_answer_older_than_a_requeued_run_releases_nothing(
    dgx1: TestClient, clock: FakeClock, moved: bool
) -> None:
    decision, _ = _running_job(dgx1, 91)
    comment = decision["set"]["admin_comment"]
    clock.advance(5)
    read_at = clock.now.timestamp()  # the cron host's squeue starts: job 91 completed
    clock.advance(1)
    again = started(
        dgx1, show_job(91, _next_run_gres(decision, moved), "node1", comment, restarts=1)
    )
    assert again["action"] == ("moved" if moved else "matched"), again
    clock.advance(1)
    answer = dgx1.post(
        "/v1/slurm/reconcile", params={"read_at": read_at}, json={"jobs": [_completed(91, comment)]}
    )
    assert answer.status_code == 200 and answer.json()["released"] == [], answer.text
    assert len(of_job(dgx1, 91)) == 1


def test_the_finished_job_is_released_by_the_next_answer_after_its_run(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """The guard only holds back an answer older than the report: one read after it
    that shows the job completed releases it, as documented."""
    decision, pinned = _running_job(dgx1, 92)
    comment = decision["set"]["admin_comment"]
    clock.advance(1)
    params = {"read_at": clock.now.timestamp()}
    answer = dgx1.post(
        "/v1/slurm/reconcile", params=params, json={"jobs": [_completed(92, comment)]}
    )
    assert answer.json()["released"] == decision["allocation_ids"], answer.text
    assert of_job(dgx1, 92) == []
    # Its end is remembered: a late report of that run records nothing.
    assert started(dgx1, show_job(92, pinned, "node1", comment))["action"] == "none"


def test_an_answer_older_than_the_job_that_took_a_reservation_releases_nothing(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """A reservation older than the grace period that no job in the answer names, taken
    by a job whose prolog reported after the answer was read (a job slurmctld created
    after that read): the answer cannot say the reservation is an orphan."""
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    clock.advance(5)
    read_at = clock.now.timestamp()  # squeue starts; job 93 is not in its snapshot
    clock.advance(1)
    text = show_job(93, _typed(decision["gpu_indices"]), "node1", decision["set"]["admin_comment"])
    assert started(dgx1, text)["action"] == "attached"
    answer = dgx1.post("/v1/slurm/reconcile", params={"read_at": read_at}, json={"jobs": []})
    assert answer.status_code == 200 and answer.json()["released"] == [], answer.text
    assert live(dgx1) == decision["allocation_ids"]
    [allocation] = of_job(dgx1, 93)
    assert gpus(allocation) == {"node1": decision["gpu_indices"]}
    # Nor is the job remembered as ended: the answer that would say so is older.
    app: Any = dgx1.app
    with app.state.service.engine.connect() as conn:
        assert not ended_jobs.ended_since(conn, "93", datetime.fromtimestamp(0, UTC))


def test_a_pushed_answer_older_than_a_requeued_runs_move_does_not_move_it_back(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """The push read job 94's first run on its reserved GPUs; before it arrived the job
    was requeued (its epilog missed) and its next run's prolog moved the allocation onto
    the GPUs Slurm gave that run. Recorded from the answer, the job was moved back onto
    GPUs it no longer runs on, and those it runs on looked free to the filter."""
    decision, pinned = _running_job(dgx1, 94)
    comment = decision["set"]["admin_comment"]
    clock.advance(5)
    read_at = clock.now.timestamp()  # squeue starts: job 94's first run
    clock.advance(1)
    other = [g for g in range(8) if g not in decision["gpu_indices"]][:2]
    again = started(dgx1, show_job(94, _typed(other), "node1", comment, restarts=1))
    assert again["action"] == "moved", again
    answer = dgx1.post(
        "/v1/slurm/reconcile",
        params={"read_at": read_at},
        json={"jobs": [running(94, comment, [pinned])]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["observed"] == [] and answer.json()["released"] == [], answer.text
    [allocation] = of_job(dgx1, 94)
    assert gpus(allocation) == {"node1": other}, "recorded from an answer older than the move"


def test_a_completing_job_after_its_epilog_is_not_recorded_over_the_next_reservation(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """slurmctld shows a job COMPLETING, with its GPUs, until EpilogSlurmctld has exited
    and every node's epilog is done: seconds after topoplace's epilog released it. Read
    then, the job looked like one running unrecorded; recorded, it superseded the
    reservation the filter had just made on the GPUs it was leaving, and those GPUs
    looked free again once the job was gone."""
    first = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    comment = first["set"]["admin_comment"]
    text = show_job(95, EVERY_GPU, "node1", comment)
    assert started(dgx1, text)["action"] == "attached"
    assert dgx1.post("/v1/jobs/95/release").status_code == 200  # its epilog
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    assert successor["action"] == "modify", successor
    clock.advance(1)
    completing = {**running(95, comment, [EVERY_GPU]), "job_state": "COMPLETING"}
    waiting = pending(96, successor["set"]["admin_comment"], "Resources")
    answer = dgx1.post(
        "/v1/slurm/reconcile",
        params={"read_at": clock.now.timestamp()},
        json={"jobs": [completing, waiting]},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["observed"] == [] and answer.json()["released"] == [], answer.text
    assert live(dgx1) == successor["allocation_ids"]
    assert of_job(dgx1, 95) == []
