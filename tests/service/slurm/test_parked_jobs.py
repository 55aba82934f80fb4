"""Pending jobs that will not start as they stand give their reservations back."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.allocations import api as allocations
from service.allocations import repository
from service.slurm.parked import parked_reason
from tests.service.conftest import FakeClock
from tests.service.slurm.squeue import live, pending, read_now, running, tick_reading
from tests.service.slurm.test_truth import gpus, of_job, show_job, started, submit


@pytest.mark.parametrize(
    ("reason", "description"),
    [
        ("JobHeldUser", ""),  # sbatch --hold, scontrol uhold
        ("JobHeldAdmin", ""),  # scontrol hold by an administrator
        # Held by Slurm when the reservation it was given is deleted: until scontrol release.
        ("ReservationDeleted", "Reservation r1 was deleted"),
        ("PartitionNodeLimit", ""),
        ("PartitionConfig", ""),
        ("BadConstraints", ""),
        ("AssocMaxJobsLimit", ""),
        ("QOSMaxGRESPerUser", ""),
        ("ReqNodeNotAvail", "ReqNodeNotAvail, UnavailableNodes:node2"),  # as 22.05.8 prints it
        # Its node is in an advance reservation (made after the job was pinned there).
        ("ReqNodeNotAvail", "ReqNodeNotAvail, May be reserved for other job"),
        ("ReqNodeNotAvail", "ReqNodeNotAvail, Reserved for maintenance"),
    ],
)
def test_a_held_or_blocked_job_gives_its_gpus_back(
    dgx1: TestClient, clock: FakeClock, reason: str, description: str
) -> None:
    decision = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    comment = decision["set"]["admin_comment"]
    assert live(dgx1) == decision["allocation_ids"]
    squeue = {"jobs": [pending(31, comment, reason, description)]}
    result = dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=squeue).json()
    assert result["released"] == decision["allocation_ids"] and result["live_jobs"] == 0
    assert live(dgx1) == []
    # Its GPUs are the next job's.
    assert submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")["action"] == "modify"


@pytest.mark.parametrize(
    ("reason", "description"),
    [
        ("Resources", ""),
        ("Priority", ""),
        ("None", ""),
        ("SchedDefer", ""),
        ("ReqNodeNotAvail", ""),  # no description: nothing says the job is blocked
    ],
)
def test_a_job_waiting_for_gpus_or_its_turn_keeps_its_reservation(
    dgx1: TestClient, clock: FakeClock, reason: str, description: str
) -> None:
    decision = submit(dgx1, tres_per_node="gres:gpu:2")
    squeue = {"jobs": [pending(32, decision["set"]["admin_comment"], reason, description)]}
    result = dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=squeue).json()
    assert result["released"] == [] and live(dgx1) == decision["allocation_ids"]


def test_a_released_job_that_starts_later_is_recorded_where_it_runs(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """Released from its hold, the job starts on GPUs Slurm gives it: the prolog's
    report creates its allocation again (the release was no end of the job)."""
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    comment = decision["set"]["admin_comment"]
    squeue = {"jobs": [pending(33, comment, "JobHeldUser")]}
    assert dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=squeue).json()["released"]
    answer = started(dgx1, show_job(33, "gpu:g5:1(IDX:5),gpu:g6:1(IDX:6)", "node1", comment))
    assert answer["action"] == "created", answer
    [allocation] = of_job(dgx1, 33)
    assert gpus(allocation) == {"node1": [5, 6]}
    now = running(33, comment, ["gpu:g5:1(IDX:5)", "gpu:g6:1(IDX:6)"])
    assert (
        dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json={"jobs": [now]}).json()[
            "released"
        ]
        == []
    )
    assert [a["id"] for a in of_job(dgx1, 33)] == [allocation["id"]]


def test_a_job_released_from_its_hold_while_squeue_was_read_keeps_its_record(
    dgx1: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squeue saw the job held; before its answer was used the job was released and
    started, and its prolog recorded it. The old answer must not release that record as
    a parked job's reservation: the job runs on those GPUs."""
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    comment = decision["set"]["admin_comment"]
    held = {"jobs": [pending(34, comment, "JobHeldUser")]}
    assert dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=held).json()["released"]
    recorded: list[str] = []

    async def slow_squeue(command: str, timeout_s: float) -> dict[str, Any]:
        clock.advance(1)  # slurmctld answered (the job held), then the job was released
        answer = started(dgx1, show_job(34, "gpu:g5:1(IDX:5),gpu:g6:1(IDX:6)", "node1", comment))
        assert answer["action"] == "created", answer
        recorded.append(answer["allocation_id"])
        clock.advance(1)
        return held

    tick_reading(dgx1, monkeypatch, slow_squeue)
    assert recorded and live(dgx1) == recorded, "a started job's record was released"


@pytest.mark.parametrize(
    ("known", "action"), [(False, "attached"), (True, "matched")], ids=["new-id", "known-id"]
)
def test_a_held_job_that_started_on_its_reservation_while_squeue_was_read_keeps_it(
    dgx1: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, known: bool, action: str
) -> None:
    """squeue saw the job held while its reservation still stood; before its answer was
    used the job was released and started on the reserved GPUs, and its prolog's report
    gave the reservation its job id or, ``known`` (the reservation carried the id before
    squeue was asked: an earlier read gave it, the job pending for its turn), matched it,
    changing nothing in it. The old answer must not release it as a parked job's. Was,
    where known: released (the report left no trace the answer could be checked
    against), the running job's GPUs free until the next read recorded it again."""
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    comment = decision["set"]["admin_comment"]
    if known:
        waiting = {"jobs": [pending(35, comment, "Priority")]}
        assert dgx1.post("/v1/slurm/reconcile", params=read_now(clock), json=waiting).json()[
            "attached"
        ]
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])

    async def slow_squeue(command: str, timeout_s: float) -> dict[str, Any]:
        clock.advance(1)
        answer = started(dgx1, show_job(35, gres, "node1", comment))
        assert answer["action"] == action, answer
        clock.advance(1)
        return {"jobs": [pending(35, comment, "JobHeldUser")]}

    tick_reading(dgx1, monkeypatch, slow_squeue)
    assert live(dgx1) == decision["allocation_ids"], "a started job's reservation was released"


def test_only_a_report_of_a_start_stamps_the_allocation_it_matches(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """A truth that matches changes nothing; only a report that the job has just started
    (the prolog's, which stamped the allocation it attached too) is worth a write: a
    periodic one (a node's devices) would write each time."""
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    [allocation_id] = decision["allocation_ids"]
    gres = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in decision["gpu_indices"])
    comment = decision["set"]["admin_comment"]
    assert started(dgx1, show_job(37, gres, "node1", comment))["action"] == "attached"
    app: Any = dgx1.app
    state = app.state.service
    indices = {"node1": list(decision["gpu_indices"])}

    def touched_at() -> object:
        with state.engine.connect() as conn:
            row = repository.by_id(conn, allocation_id)
        assert row is not None
        return row["touched_at"]

    attached_at = touched_at()
    assert attached_at is not None
    clock.advance(1)
    args = (state, "37", "slurm:alice", indices, [allocation_id], "observed")
    assert allocations.observe(*args).action == "matched"
    assert touched_at() == attached_at
    assert allocations.observe(*args, touch=True).action == "matched"
    assert touched_at() != attached_at


def test_reasons_slurm_does_not_name_park_nothing() -> None:
    assert parked_reason({"state_reason": "JobHeldUser"}) == "JobHeldUser"
    assert parked_reason({"state_reason": "Resources"}) is None
    assert parked_reason({"state_reason": ""}) is None
    assert parked_reason({}) is None
    unavailable = {"state_reason": "ReqNodeNotAvail", "state_description": "ReqNodeNotAvail"}
    assert parked_reason(unavailable) is None
