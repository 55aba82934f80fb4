"""/score's remembered rows: per service state, reused while a node is unchanged, bounded."""

from __future__ import annotations

from fastapi.testclient import TestClient

from placement import ClusterState, PlacementRequest
from placement.profiles import build_profile
from service.allocations import api
from service.allocations.schemas import ScoreRequest
from service.allocations.score_cache import ScoreCache
from service.app import create_app
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


def _state(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def test_each_state_keeps_its_own_rows(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    add_nodes(client, ("hgx-h100", "h0"), ("dgx1-v100", "d0"))
    with TestClient(create_app(settings, clock=clock, background=False)) as other:
        assert client.post("/v1/score", json={"gpus": 2}).status_code == 200
        assert len(_state(client).score_cache.rows) == 2
        assert _state(other).score_cache.rows == {}


def test_rows_and_plans_are_reused_while_the_node_is_unchanged(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"), ("dgx1-v100", "d0"))
    state = _state(client)
    body = ScoreRequest(gpus=2, nodes=("h0", "d0"))
    first = {r.node: r for r in api.score(state, body)}
    again = {r.node: r for r in api.score(state, body)}
    assert all(first[n] is again[n] for n in first)  # the same rows, not rebuilt
    api.score_json(state, body)
    encoded = dict(state.score_cache.rows)
    api.score_json(state, body)
    assert all(state.score_cache.rows[k] is v for k, v in encoded.items())
    # A reservation on h0 changes what h0 would give: its row is made again, d0's is kept.
    assert client.post("/v1/place", json={"gpus": 2, "nodes": ["h0"]}).status_code == 201
    changed = {r.node: r for r in api.score(state, body)}
    assert changed["h0"].task is not first["h0"].task
    assert changed["d0"] is first["d0"]  # the same node, rank and score: the same row


def test_the_cache_is_bounded() -> None:
    cluster = ClusterState()
    cluster.upsert(build_profile("hgx-h100", "h0"))
    cluster.upsert(build_profile("dgx1-v100", "d0"))
    tasks = [v.task for v in cluster.evaluate(PlacementRequest(gpus=1)) if v.task is not None]
    cache = ScoreCache(limit=1)
    for task in tasks:
        cache.fit(1, 50.0, task)
        cache.row(task, 50.0)
    assert len(cache.rows) == 1 and cache.rows[id(tasks[-1])][0] is tasks[-1]
    assert cache.fit(1, 50.0, tasks[-1]) is cache.fit(1, 50.0, tasks[-1])
    assert cache.fit(2, 50.0, tasks[-1]).task is cache.fit(1, 50.0, tasks[-1]).task
