"""A gang member binding onto the gang's pending reservation as its TTL runs out."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.allocations import api as allocations
from service.k8s.kube_api import KubeApiError
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODES = ["h100-a", "h100-b"]
RING = {"topoplace.io/gang": "ring", "topoplace.io/gang-size": "2"}
GANG_TTL_S = ExtenderSettings().gang_ttl_s


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Agents' heartbeats outlast the gang's TTL: the nodes stay placeable past it."""
    return Settings(database_url=database_url, heartbeat_ttl_s=GANG_TTL_S * 2)


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(k8s_client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"))
    return k8s_client


def _bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    error: str = client.post("/k8s/v1/bind", json=binding_args(p, node)).json()["Error"]
    return error


def _first_binding_refused(fleet: TestClient, kube: FakeKubeApi) -> tuple[dict[str, Any], str]:
    """A gang of two 8-GPU pods whose first member's Binding the API server refuses:
    the gang's reservation stays pending. The first member and its node."""
    first = kube.add(pod("ring-0", 8, annotations=RING))
    kube.add(pod("ring-1", 8, annotations=RING))
    node = fleet.post("/k8s/v1/filter", json=names_args(first, NODES)).json()["NodeNames"][0]
    kube.refuse_with = KubeApiError(403, 'pods "ring-0" is forbidden')
    assert "forbidden" in _bind(fleet, first, node)
    kube.refuse_with = None
    return first, node


def test_a_member_bound_as_the_gangs_ttl_ran_out_keeps_its_gpus_held(
    fleet: TestClient, kube: FakeKubeApi, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first member's Binding is refused: the gang keeps its reservation, pending
    until a member binds. A member that claims it near the end of its TTL writes its
    Binding; the sweep must not end the reservation under that pod meanwhile, or its
    GPUs go to the next job while the pod runs on them."""
    state: ServiceState = fleet.app.state.service  # type: ignore[attr-defined]
    first, node = _first_binding_refused(fleet, kube)
    clock.advance(GANG_TTL_S - 0.5)  # the member comes back just before the TTL ends

    binding = kube.bind

    def slow_binding(*args: Any) -> None:
        clock.advance(1.0)  # the API server takes a second; the background sweep runs
        allocations.sweep(state)
        binding(*args)

    monkeypatch.setattr(kube, "bind", slow_binding)
    assert _bind(fleet, first, node) == ""
    assert kube.pods[("ml-team", "ring-0")]["spec"]["nodeName"] == node

    (gang,) = fleet.get("/v1/allocations", params={"job_id": "k8s-gang:ml-team/ring"}).json()[
        "allocations"
    ]
    assert gang["state"] == "active", gang["state"]
    # Nothing else gets the bound member's GPUs.
    other = fleet.post("/v1/place", json={"gpus": 8, "nodes": [node]})
    assert other.status_code == 409, other.text


def test_a_member_coming_after_the_ttl_passed_reserves_the_gang_anew(
    fleet: TestClient, kube: FakeKubeApi, clock: FakeClock
) -> None:
    """The sweep has not run yet: the reservation still reads live, but its time is up.
    The member does not bind onto it (it would expire under the pod): it is expired
    and the gang reserved again for this Binding."""
    first, node = _first_binding_refused(fleet, kube)
    clock.advance(GANG_TTL_S + 1)

    assert _bind(fleet, first, node) == ""
    listed = fleet.get("/v1/allocations", params={"job_id": "k8s-gang:ml-team/ring"}).json()
    states = sorted(a["state"] for a in listed["allocations"])
    assert states == ["active", "expired"]
    (live,) = [a for a in listed["allocations"] if a["state"] == "active"]
    notes = kube.pods[("ml-team", "ring-0")]["metadata"]["annotations"]
    assert notes["topoplace.io/allocation"] == live["id"]
