"""A requeued job runs again under the same job id, and its new run is recorded.

``scontrol requeue``, a node failure or a failed prolog puts a running job back in
the queue with its job id: the first run's epilog ends it (and the service remembers
that end), then the job starts again, perhaps on other GPUs, and the prolog reports it
under the same id with ``Restarts=`` one higher. That report is not one of the ended
run processed late: turned away, the GPUs the job really runs on would look free, and
the filter or /place would give them to another job (docs/slurm.md, "Requeued jobs").
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.slurm.test_late_prolog import _epilog, _ignored
from tests.service.slurm.test_truth import gpus, of_job, show_job, started, submit

EVERY_GPU = ",".join(f"gpu:g{g}:1(IDX:{g})" for g in range(8))


def _typed(indices: list[int]) -> str:
    return ",".join(f"gpu:g{g}:1(IDX:{g})" for g in indices)


def _whole_node_refused(client: TestClient, node: str) -> None:
    """No 8-GPU job is pinned on a node where the requeued job runs."""
    successor: dict[str, Any] = submit(client, tres_per_node="gres:gpu:8", req_nodes=node)
    assert successor["action"] == "unchanged", successor


def test_a_requeued_jobs_next_run_is_recorded_after_the_first_runs_epilog(
    dgx1: TestClient,
) -> None:
    decision = submit(dgx1, tres_per_node="gres:gpu:2", req_nodes="node1")
    comment = decision["set"]["admin_comment"]
    pinned = _typed(decision["gpu_indices"])
    first = started(dgx1, show_job(80, pinned, "node1", comment))
    assert first["action"] == "attached", first
    _epilog(dgx1, 80, decision)  # requeued: the first run's epilog
    # The pinned job starts again on its GPUs, under the same id.
    again = started(dgx1, show_job(80, pinned, "node1", comment, restarts=1))
    assert again["action"] == "created", again
    [allocation] = of_job(dgx1, 80)
    assert gpus(allocation) == {"node1": decision["gpu_indices"]}
    _whole_node_refused(dgx1, "node1")


def test_a_requeued_job_slurm_placed_elsewhere_is_recorded(dgx1: TestClient) -> None:
    assert started(dgx1, show_job(81, "gpu:2(IDX:0-1)", "node1"))["action"] == "created"
    _epilog(dgx1, 81)
    again = started(dgx1, show_job(81, "gpu:2(IDX:4-5)", "node2", restarts=1))
    assert again["action"] == "created", again
    [allocation] = of_job(dgx1, 81)
    assert gpus(allocation) == {"node2": [4, 5]}
    _whole_node_refused(dgx1, "node2")
    # The first run's GPUs are free again.
    assert submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")["action"] == "modify"


def test_a_late_report_of_the_requeued_run_still_records_nothing(dgx1: TestClient) -> None:
    """The first run's own report, processed after its epilog, is still turned away."""
    text = show_job(82, EVERY_GPU, "node1")
    _epilog(dgx1, 82)
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    assert successor["action"] == "modify", successor
    _ignored(started(dgx1, text))
    assert of_job(dgx1, 82) == []


def _wckey(text: str, wckey: str) -> str:
    """``text`` as Slurm prints it with TrackWCKey=yes: the job's ``--wckey``, as the user
    wrote it, after its account and QOS, before JobState= and Requeue= Restarts=."""
    return text.replace(
        " JobState=", f" Priority=1 Nice=0 Account=research QOS=normal WCKey={wckey} JobState=", 1
    )


def test_a_restart_count_written_in_the_wckey_is_not_read_as_slurms(
    dgx1: TestClient,
) -> None:
    """A job whose ``--wckey`` reads ``Requeue=1 Restarts=1 BatchFlag=1`` has never been
    requeued: its report processed after its end is still turned away. Read from the
    wckey, it was recorded, and released the reservation of the job given the GPUs next."""
    forged = "x Requeue=1 Restarts=1 BatchFlag=1"
    text = _wckey(show_job(84, EVERY_GPU, "node1"), forged)
    _epilog(dgx1, 84)
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    assert successor["action"] == "modify", successor
    _ignored(started(dgx1, text))
    assert of_job(dgx1, 84) == []
    # A real requeue, with the same wckey, is still read as one.
    again = _wckey(show_job(85, "gpu:2(IDX:0-1)", "node2", restarts=1), forged)
    assert started(dgx1, again)["action"] == "created"


def test_a_job_state_written_in_the_wckey_is_not_read_as_slurms(dgx1: TestClient) -> None:
    """A report read after the job completed is turned away by its JobState=, even when
    the job's ``--wckey`` reads ``JobState=RUNNING`` (and no epilog said its end)."""
    text = _wckey(show_job(86, EVERY_GPU, "node1", state="COMPLETED"), "x JobState=RUNNING")
    answer = started(dgx1, text)
    assert answer["action"] == "none" and "COMPLETED" in answer["message"], answer
    assert of_job(dgx1, 86) == []


def test_gpus_written_in_the_wckey_are_not_read_as_slurms(dgx1: TestClient) -> None:
    """A wckey reading ``Nodes=node2 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)`` claims no GPU:
    read as Slurm's per-node line, it released the reservation of another user's job on
    node2 and held all of node2's GPUs for a job that runs on two of node1's."""
    bobs = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node2", user_name="bob")
    assert bobs["action"] == "modify", bobs
    forged = "x Nodes=node2 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)"
    answer = started(dgx1, _wckey(show_job(87, "gpu:2(IDX:0-1)", "node1"), forged))
    assert answer["action"] == "created" and answer["superseded"] == [], answer
    [allocation] = of_job(dgx1, 87)
    assert gpus(allocation) == {"node1": [0, 1]}


@pytest.mark.parametrize("first", [0, 1], ids=["first run", "requeued run"])
def test_an_earlier_runs_report_after_the_requeued_runs_moves_nothing_back(
    dgx1: TestClient, first: int
) -> None:
    """An earlier run's prolog report (``Restarts=0``, or 1 before a second requeue),
    processed only after the requeued run's was: the job runs on the requeued run's
    GPUs, and another job holds the earlier run's. The job's live allocation (the
    requeued run's) made the late report look like one of a new job under the same id:
    it moved the job back onto the earlier run's GPUs, releasing their holder, and left
    the GPUs the job runs on looking free."""
    text = show_job(83, _typed(list(range(8))), "node1", restarts=first)
    _epilog(dgx1, 83)
    again = started(dgx1, show_job(83, "gpu:2(IDX:4-5)", "node2", restarts=first + 1))
    assert again["action"] == "created", again
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    assert successor["action"] == "modify", successor

    _ignored(started(dgx1, text))

    [allocation] = of_job(dgx1, 83)
    assert gpus(allocation) == {"node2": [4, 5]}
    for allocation_id in successor["allocation_ids"]:
        assert dgx1.get(f"/v1/allocations/{allocation_id}").json()["state"] != "released"


def test_a_report_read_while_the_job_was_completing_records_nothing(dgx1: TestClient) -> None:
    """A requeued run cancelled while its prolog ran: scontrol shows it ``COMPLETING``
    (leaving its GPUs), and its report, processed after its epilog, is not held to the
    end remembered (``Restarts=1``). Recorded, it took the GPUs back from the reservation
    made on them since, for a job that runs nowhere, as the reconcile loop never records
    a completing job for that reason."""
    text = show_job(88, EVERY_GPU, "node1", state="COMPLETING", restarts=1)
    _epilog(dgx1, 88)
    successor = submit(dgx1, tres_per_node="gres:gpu:8", req_nodes="node1")
    assert successor["action"] == "modify", successor
    answer = started(dgx1, text)
    assert answer["action"] == "none" and "COMPLETING" in answer["message"], answer
    assert of_job(dgx1, 88) == []
    reserved = dgx1.get(f"/v1/allocations/{successor['allocation_ids'][0]}").json()
    assert reserved["state"] == "active", reserved
