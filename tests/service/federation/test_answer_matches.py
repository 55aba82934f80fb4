"""A region's placed answer must be the allocation asked for.

A region that answers 201 with fewer tasks than the gang, fewer or more GPUs a
task than asked, or one GPU twice (in a task, or in two) has not placed the job
asked: passed on, the dispatcher launches a gang short of a member, or two tasks
on one GPU. Its answer is an answer lost, as one that is no allocation
(test_routing.py): the region may hold something for the key, so the key stays.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.service.federation.fake_regions import Regions


def task(node: str, *uuids: str) -> dict[str, Any]:
    return {"node": node, "gpu_uuids": list(uuids)}


WRONG = [
    pytest.param([task("n1", "GPU-0", "GPU-1")], id="one-task-of-a-gang-of-two"),
    pytest.param([task("n1", "GPU-0"), task("n1", "GPU-1")], id="one-gpu-a-task"),
    pytest.param(
        [task("n1", "GPU-0", "GPU-1", "GPU-2"), task("n1", "GPU-3", "GPU-4", "GPU-5")],
        id="three-gpus-a-task",
    ),
    pytest.param([task("n1", "GPU-0", "GPU-0"), task("n1", "GPU-1", "GPU-2")], id="a-gpu-twice"),
    pytest.param(
        [task("n1", "GPU-0", "GPU-1"), task("n1", "GPU-1", "GPU-2")], id="a-gpu-in-two-tasks"
    ),
    pytest.param(
        [task("n1", "GPU-0", "GPU-1"), task("n1", "GPU-2", "GPU-3"), task("n1", "GPU-4", "GPU-5")],
        id="three-tasks-of-a-gang-of-two",
    ),
]


RIGHT = {"id": "alloc", "tasks": [task("n1", "GPU-0", "GPU-1"), task("n2", "GPU-2", "GPU-3")]}


def gang(client: TestClient, key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    answer: httpx.Response = client.post(
        "/v1/federation/place", json={"gpus": 2, "tasks": 2}, headers=headers
    )
    return answer


@pytest.mark.parametrize("tasks", WRONG)
def test_a_placed_answer_other_than_the_job_asked_is_an_answer_lost(
    client: TestClient, regions: Regions, tasks: list[dict[str, Any]]
) -> None:
    body = {"id": "alloc-cheap", "tasks": tasks}
    regions.answers["cheap"] = lambda request: httpx.Response(201, json=body)
    regions.answers["mid"] = lambda request: httpx.Response(201, json=RIGHT)
    keyed = gang(client, "k-wrong")
    assert keyed.status_code == 503, keyed.text
    error = keyed.json()["error"]
    assert error["code"] == "region_unavailable"
    assert "not the allocation asked" in error["message"]
    assert [r for r, key, _ in regions.seen if key == "k-wrong"] == ["cheap"]
    unkeyed = gang(client)
    assert unkeyed.status_code == 201 and unkeyed.json()["region"] == "mid", unkeyed.text
    assert unkeyed.json()["attempts"][0]["outcome"] == "unanswered"


def test_the_allocation_asked_is_passed_on(client: TestClient, regions: Regions) -> None:
    regions.answers["cheap"] = lambda request: httpx.Response(201, json=RIGHT)
    placed = gang(client, "k-right")
    assert placed.status_code == 201, placed.text
    assert placed.json()["gpus"] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert placed.json()["nodes"] == ["n1", "n2"]
