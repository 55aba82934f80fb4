"""/score answers are bounded: over TOPOPLACE_MAX_SCORE_NODES nodes is 422 unless paged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import names_args, pod
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

MAXIMUM = 3
FLEET = [("hgx-h100", f"h100-{n}") for n in range(4)] + [("pcie-8x-l40s", "l40s-0")]


@pytest.fixture
def bounded(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    app = create_app(
        settings.model_copy(update={"max_score_nodes": MAXIMUM}), clock=clock, background=False
    )
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    app.state.k8s_api = FakeKubeApi()
    with TestClient(app) as client:
        add_nodes(client, *FLEET)
        yield client


def _error(response: Any) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == "limit"
    return error


def test_an_answer_over_the_bound_is_refused_saying_how_to_page(bounded: TestClient) -> None:
    error = _error(bounded.post("/v1/score", json={"gpus": 1}))
    assert "would list 5 nodes, over the limit of 3" in error["message"]
    assert "limit=N&offset=M" in error["message"]
    names = [name for _, name in FLEET] * 1000  # the 4 MB request: many names
    _error(bounded.post("/v1/score", json={"gpus": 1, "nodes": names}))
    _error(bounded.post("/v1/score", params={"limit": MAXIMUM + 1}, json={"gpus": 1}))


def test_within_the_bound_the_answer_is_the_usual_one(bounded: TestClient) -> None:
    answer = bounded.post("/v1/score", json={"gpus": 1, "nodes": ["h100-0", "l40s-0"]}).json()
    assert set(answer) == {"nodes"} and len(answer["nodes"]) == 2


def test_pages_are_slices_of_one_ranking(bounded: TestClient) -> None:
    pages, offset = [], 0
    while offset is not None:
        paging = {"limit": 2, "offset": offset}
        response = bounded.post("/v1/score", params=paging, json={"gpus": 8})
        assert response.status_code == 200, response.text
        page = response.json()
        assert page["total"] == len(FLEET) and page["offset"] == offset
        assert len(page["nodes"]) <= 2
        pages.append(page["nodes"])
        offset = page["next_offset"]
    assert [len(p) for p in pages] == [2, 2, 1]
    rows = [row for page in pages for row in page]
    assert sorted(row["node"] for row in rows) == sorted(name for _, name in FLEET)
    ranks = sorted(row["rank"] for row in rows if row["fits"])
    assert ranks == list(range(1, len(ranks) + 1))  # ranks of the whole answer, not per page
    beyond = bounded.post("/v1/score", params={"offset": 10}, json={"gpus": 1}).json()
    assert beyond["nodes"] == [] and beyond["next_offset"] is None


def test_the_kubernetes_extender_scores_past_the_bound(bounded: TestClient) -> None:
    candidates = [name for _, name in FLEET]
    response = bounded.post("/k8s/v1/prioritize", json=names_args(pod("trainer", 1), candidates))
    assert response.status_code == 200, response.text
    assert [h["Host"] for h in response.json()] == candidates


def test_an_offset_past_what_grpc_holds_is_refused_not_a_500(bounded: TestClient) -> None:
    # 2**64 made the page's JSON encoder fail (500); 2**31 was answered, though the page's
    # ``offset`` is an int32 over gRPC, which cannot be asked for it.
    for offset in (2**64, 2**31):
        response = bounded.post(
            "/v1/score", params={"limit": 1, "offset": offset}, json={"gpus": 1}
        )
        assert response.status_code == 422, response.text
        assert response.json()["error"]["detail"]["field"] == "query.offset"
    last = bounded.post("/v1/score", params={"limit": 1, "offset": 2**31 - 1}, json={"gpus": 1})
    assert last.status_code == 200, last.text
    assert last.json()["nodes"] == [] and last.json()["next_offset"] is None
