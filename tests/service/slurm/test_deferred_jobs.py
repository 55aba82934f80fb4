"""A job that cannot start now (--dependency, --begin later) is left to Slurm unreserved."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.service.slurm.test_truth import gpus, of_job, show_job, started, submit


def live(client: TestClient) -> list[str]:
    rows = client.get("/v1/allocations").json()["allocations"]
    return [a["id"] for a in rows if a["state"] in ("pending", "active")]


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"dependency": "afterok:41"}, "--dependency=afterok:41"),
        ({"dependency": "singleton"}, "--dependency=singleton"),
        ({"begin_in_s": 3600}, "only in 3600 s (--begin)"),
        ({"begin_in_s": 0.5}, "(--begin)"),
        ({"held": True}, "held (--hold)"),
    ],
)
@pytest.mark.parametrize("propose", [False, True], ids=["job_submit", "cli_filter"])
def test_a_deferred_job_is_left_to_slurm_holding_nothing(
    dgx1: TestClient, fields: dict[str, object], said: str, propose: bool
) -> None:
    path = "/v1/slurm/job-submit" + ("?propose=true" if propose else "")
    body = {"tres_per_node": "gres:gpu:8", "user_name": "alice", **fields}
    decision = dgx1.post(path, json=body).json()
    assert decision["action"] == "unchanged" and said in decision["message"], decision
    assert decision["set"] == {} and decision["allocation_ids"] == []
    assert live(dgx1) == []


@pytest.mark.parametrize(
    "fields",
    [
        {"begin_in_s": 0},
        {"begin_in_s": -2},
        {"dependency": ""},
        {"begin_in_s": None},
        {"held": False},
    ],
)
def test_a_job_that_may_start_now_is_placed(dgx1: TestClient, fields: dict[str, object]) -> None:
    """`--begin=now` reaches the script a second or two in the past; an empty
    dependency is none."""
    decision = submit(dgx1, tres_per_node="gres:gpu:2", **fields)
    assert decision["action"] == "modify" and live(dgx1) == decision["allocation_ids"]


@pytest.mark.parametrize("begin_in_s", ["NaN", "Infinity", "soon"])
def test_a_begin_that_is_no_number_is_refused(dgx1: TestClient, begin_in_s: str) -> None:
    body = (
        '{"tres_per_node": "gres:gpu:1", "begin_in_s": '
        + (begin_in_s if begin_in_s != "soon" else '"soon"')
        + "}"
    )
    answer = dgx1.post(
        "/v1/slurm/job-submit", content=body, headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"


def test_a_deferred_job_that_starts_is_recorded_on_the_gpus_slurm_gave_it(
    dgx1: TestClient,
) -> None:
    assert submit(dgx1, tres_per_node="gres:gpu:2", dependency="afterok:7")["action"] == (
        "unchanged"
    )
    answer = started(dgx1, show_job(8, "gpu:2(IDX:0-1)", "node2"))
    assert answer["action"] == "created", answer
    [allocation] = of_job(dgx1, 8)
    assert gpus(allocation) == {"node2": [0, 1]} and allocation["owner"] == "slurm:alice"


def test_a_held_job_released_later_is_recorded_on_the_gpus_slurm_gave_it(
    dgx1: TestClient,
) -> None:
    """sbatch --hold reserves nothing; after scontrol release Slurm starts it where it
    chooses and the prolog's report records it."""
    decision = submit(dgx1, tres_per_node="gres:gpu:4", held=True)
    assert decision["action"] == "unchanged" and live(dgx1) == [], decision
    answer = started(dgx1, show_job(9, "gpu:4(IDX:4-7)", "node1"))
    assert answer["action"] == "created", answer
    [allocation] = of_job(dgx1, 9)
    assert gpus(allocation) == {"node1": [4, 5, 6, 7]}


@pytest.mark.parametrize("held", ['"yes"', "1", "null"])
def test_a_hold_that_is_no_boolean_is_refused(dgx1: TestClient, held: str) -> None:
    answer = dgx1.post(
        "/v1/slurm/job-submit",
        content='{"tres_per_node": "gres:gpu:1", "held": ' + held + "}",
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"
