"""Two answers a replay of real kube-scheduler traffic questioned: equal nodes get equal
priorities, and a bind without an API server says what is missing."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


def _post(client: TestClient, verb: str, body: dict[str, Any]) -> Any:
    response = client.post(f"/k8s/v1/{verb}", json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_identical_free_nodes_get_identical_priorities(k8s_client: TestClient, gpus: int):
    add_nodes(k8s_client, ("hgx-h100", "twin-a"), ("hgx-h100", "twin-b"), ("dgx1-v100", "v100-c"))
    p = pod("trainer-0", gpus)
    names = ["twin-a", "twin-b", "v100-c"]
    assert _post(k8s_client, "filter", names_args(p, names))["NodeNames"] == names
    scores = {h["Host"]: h["Score"] for h in _post(k8s_client, "prioritize", names_args(p, names))}
    assert scores["twin-a"] == scores["twin-b"] == 10
    if gpus == 4:  # a V100 pair on NVLink may score as high as an H100 pair
        assert scores["v100-c"] < 10


def test_identical_nodes_stay_equal_when_prioritize_judges_afresh(k8s_client: TestClient):
    add_nodes(k8s_client, ("hgx-h100", "twin-a"), ("hgx-h100", "twin-b"))
    p = pod("trainer-1", 2)
    # No filter first: prioritize asks the engine itself.
    scores = [
        h["Score"] for h in _post(k8s_client, "prioritize", names_args(p, ["twin-b", "twin-a"]))
    ]
    assert scores == [10, 10]


def test_a_busier_twin_scores_below_the_free_one(k8s_client: TestClient):
    add_nodes(k8s_client, ("hgx-h100", "twin-a"), ("hgx-h100", "twin-b"))
    assert k8s_client.post("/v1/place", json={"gpus": 3, "nodes": ["twin-b"]}).status_code == 201
    p = pod("trainer-2", 4)
    _post(k8s_client, "filter", names_args(p, ["twin-a", "twin-b"]))
    scores = {
        h["Host"]: h["Score"]
        for h in _post(k8s_client, "prioritize", names_args(p, ["twin-a", "twin-b"]))
    }
    assert scores["twin-a"] != scores["twin-b"]
    assert max(scores.values()) == 10


@pytest.fixture
def no_api_client(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> Iterator[TestClient]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("TOPOPLACE_K8S_KUBECONFIG", raising=False)
    app = create_app(settings, clock=clock, background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    with TestClient(app) as client:
        yield client


def test_bind_without_an_api_server_names_what_is_missing(no_api_client: TestClient):
    add_nodes(no_api_client, ("hgx-h100", "h100-a"))
    p = pod("trainer-0", 2)
    assert _post(no_api_client, "filter", names_args(p, ["h100-a"]))["NodeNames"] == ["h100-a"]
    error = _post(no_api_client, "bind", binding_args(p, "h100-a"))["Error"]
    assert "cannot read the pod" not in error
    assert error.startswith("topoplace: cannot bind: no Kubernetes API server is configured")
    assert "TOPOPLACE_K8S_KUBECONFIG" in error
    # Nothing was reserved for a pod that could not be bound.
    live = no_api_client.get("/v1/allocations", params={"job_id": p["metadata"]["uid"]}).json()
    assert live["allocations"] == []
