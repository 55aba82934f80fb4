"""A submission sent again under its Idempotency-Key (job_submit.lua resends one whose
connection closed with no answer, which may be a service that committed the
reservation and stopped before answering): the same reservations, never a second set."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.allocations.results import Allocation
from service.slurm import service as slurm_service
from tests.service.slurm.test_job_submit_api import NO_VAL, live

BASE = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "user_name": "alice"}


def send(client: TestClient, key: str | None, **fields: Any) -> Any:
    headers = {} if key is None else {"Idempotency-Key": key}
    return client.post("/v1/slurm/job-submit", json={**BASE, **fields}, headers=headers)


def twice(client: TestClient, key: str, **fields: Any) -> dict[str, Any]:
    first, again = send(client, key, **fields), send(client, key, **fields)
    assert first.status_code == again.status_code == 200, (first.text, again.text)
    assert first.json()["action"] == "modify", first.text
    # The same answer: the same nodes, GPUs and allocations.
    assert again.json()["set"] == first.json()["set"]
    assert again.json()["allocation_ids"] == first.json()["allocation_ids"]
    answer: dict[str, Any] = first.json()
    return answer


def test_a_one_node_submission_sent_again_is_answered_with_its_reservation(
    dgx1: TestClient,
) -> None:
    decision = twice(dgx1, "slurm-ctld-1-1.0-1", tres_per_job="gres:gpu:4")
    assert [a["id"] for a in live(dgx1)] == decision["allocation_ids"]
    # Another submission, another key: a reservation of its own.
    other = send(dgx1, "slurm-ctld-1-1.0-2", tres_per_job="gres:gpu:4").json()
    assert other["allocation_ids"] != decision["allocation_ids"] and len(live(dgx1)) == 2


def test_a_multi_node_gang_sent_again_is_answered_with_its_reservation(dgx1: TestClient) -> None:
    decision = twice(dgx1, "k", tres_per_node="gres:gpu:4", min_nodes=2, max_nodes=2)
    assert sorted(a["id"] for a in live(dgx1)) == sorted(decision["allocation_ids"])


def test_nodes_placed_one_by_one_sent_again_are_answered_with_their_reservations(
    dgx1: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gang gives the nodes different GPUs: released, and the nodes placed one by
    one under keys of their own; the resend finds the gang given back and answers with
    the nodes the first sending kept."""
    real = slurm_service._node_sets

    def gang_split(allocation: Allocation) -> dict[str, tuple[int, ...]]:
        sets = real(allocation)
        if len(allocation.tasks) == 1:
            return sets
        return {node: (i,) for i, node in enumerate(sets)}  # as if each node got others

    monkeypatch.setattr(slurm_service, "_node_sets", gang_split)
    decision = twice(dgx1, "k", tres_per_node="gres:gpu:4", min_nodes=2, max_nodes=2)
    assert sorted(a["id"] for a in live(dgx1)) == sorted(decision["allocation_ids"])
    assert len(decision["allocation_ids"]) == 2
    everything = dgx1.get("/v1/allocations").json()["allocations"]
    assert [a["state"] for a in everything].count("released") == 1  # the gang, once


def test_a_resend_whose_reservation_was_given_back_is_left_to_slurm(dgx1: TestClient) -> None:
    """Pinned to a reservation no longer held, the job would run on GPUs nobody holds for
    it; reserved anew, the resend would hold a second set beside what the first did."""
    first = send(dgx1, "k", tres_per_job="gres:gpu:4").json()
    [allocation_id] = first["allocation_ids"]
    assert dgx1.post(f"/v1/allocations/{allocation_id}/release").status_code == 200
    again = send(dgx1, "k", tres_per_job="gres:gpu:4")
    assert again.status_code == 200, again.text
    assert again.json()["action"] == "unchanged"
    assert "no longer held" in again.json()["message"]
    assert live(dgx1) == []


def test_a_key_sent_with_another_submission_is_refused_and_reserves_nothing(
    dgx1: TestClient,
) -> None:
    send(dgx1, "k", tres_per_job="gres:gpu:2")
    before = live(dgx1)
    refused = send(dgx1, "k", tres_per_job="gres:gpu:4")
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["code"] == "conflict"
    assert live(dgx1) == before


@pytest.mark.parametrize("key", ["", "k" * 257])
def test_a_key_out_of_bounds_is_refused_and_reserves_nothing(dgx1: TestClient, key: str) -> None:
    refused = send(dgx1, key, tres_per_job="gres:gpu:2")
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["detail"]["field"] == "header.idempotency-key"
    assert live(dgx1) == []
