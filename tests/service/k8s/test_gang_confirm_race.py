"""A member's claim racing the confirm of the gang's pending reservation."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.allocations import api as allocations
from service.allocations.results import Allocation
from service.errors import Unavailable
from service.k8s.kube_api import KubeApiError
from service.k8s.reconcile import reconcile_once
from service.state import ServiceState
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODES = ["h100-a", "h100-b"]
RING = {"topoplace.io/gang": "ring", "topoplace.io/gang-size": "2"}
GANG = "k8s-gang:ml-team/ring"


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(k8s_client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"))
    return k8s_client


def _bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    error: str = client.post("/k8s/v1/bind", json=binding_args(p, node)).json()["Error"]
    return error


def _live(fleet: TestClient) -> list[dict[str, Any]]:
    found = fleet.get("/v1/allocations", params={"job_id": GANG}).json()["allocations"]
    return [a for a in found if a["state"] in ("pending", "active", "degraded")]


def test_a_claim_racing_the_reconcilers_confirm_keeps_the_gangs_reservation(
    fleet: TestClient, kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first member bound, its confirm lost to a database blink: the reservation stays
    pending and the reconciler confirms it, as a bound member carries it. A second
    member's claim stamped it just before that confirm and gives it its TTL again just
    after, which an active reservation has not: the claim must keep the reservation it
    stamped, not forget it and try to reserve the gang again over GPUs it holds."""
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))
    extender = fleet.app.state.k8s  # type: ignore[attr-defined]
    node = fleet.post("/k8s/v1/filter", json=names_args(first, NODES)).json()["NodeNames"][0]
    other = next(n for n in NODES if n != node)

    confirm = allocations.confirm

    def blink(*args: Any, **kwargs: Any) -> Allocation:
        raise Unavailable("the database is unreachable")

    monkeypatch.setattr(allocations, "confirm", blink)
    assert _bind(fleet, first, node) == ""
    monkeypatch.setattr(allocations, "confirm", confirm)
    (gang,) = _live(fleet)
    assert gang["state"] == "pending"

    touch = allocations.touch

    def touched_then_confirmed(state: ServiceState, allocation_id: str) -> Allocation | None:
        stamped = touch(state, allocation_id)
        # The reconciler's pass, on its own thread, commits between the stamp and the TTL.
        reconcile_once(state, kube, extender.gangs, 60.0)
        return stamped

    monkeypatch.setattr(allocations, "touch", touched_then_confirmed)
    assert fleet.post("/k8s/v1/filter", json=names_args(second, NODES)).json()["NodeNames"] == [
        other
    ]
    assert _bind(fleet, second, other) == ""
    (after,) = _live(fleet)
    assert (after["id"], after["state"]) == (gang["id"], "active")
    notes = [b["metadata"]["annotations"]["topoplace.io/allocation"] for b in kube.bindings]
    assert notes == [gang["id"], gang["id"]]


def test_a_claim_whose_ttl_cannot_be_given_for_a_database_blink_forgets_nothing(
    fleet: TestClient, kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first member's Binding refused: the reservation stays pending. The second
    member's claim cannot give it its TTL again (the database blinked): its bind fails,
    and the gang's reservation is still the one the next try claims."""
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))
    node = fleet.post("/k8s/v1/filter", json=names_args(first, NODES)).json()["NodeNames"][0]
    other = next(n for n in NODES if n != node)
    kube.refuse_with = KubeApiError(403, 'pods "ring-0" is forbidden')
    assert "forbidden" in _bind(fleet, first, node)
    kube.refuse_with = None
    (gang,) = _live(fleet)
    extend = allocations.extend

    def blink(*args: Any, **kwargs: Any) -> Allocation:
        raise Unavailable("the database is unreachable")

    monkeypatch.setattr(allocations, "extend", blink)
    answer = fleet.post("/k8s/v1/bind", json=binding_args(second, other))
    assert answer.status_code == 503 or answer.json()["Error"]
    assert kube.bindings == []
    monkeypatch.setattr(allocations, "extend", extend)
    assert _bind(fleet, second, other) == ""
    assert _bind(fleet, first, node) == ""
    (after,) = _live(fleet)
    assert (after["id"], after["state"]) == (gang["id"], "active")


def test_a_gang_reservation_whose_key_replays_an_ended_one_binds_nothing(
    fleet: TestClient, kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gang's reservation given back, and the member's next key counted short (two
    binds of one pod counting at once, or a count past a listing's cap): the key replays
    the ended reservation, and its Binding would name GPUs nobody holds. It must be
    refused, nothing bound, and the next count reserve anew."""
    first = kube.add(pod("ring-0", 8, annotations=RING))
    node = fleet.post("/k8s/v1/filter", json=names_args(first, NODES)).json()["NodeNames"][0]
    kube.refuse_with = KubeApiError(403, 'pods "ring-0" is forbidden')
    assert "forbidden" in _bind(fleet, first, node)
    kube.refuse_with = None
    (gang,) = _live(fleet)
    assert fleet.post(f"/v1/allocations/{gang['id']}/release").status_code == 200
    count = allocations.count_for_job
    monkeypatch.setattr(allocations, "count_for_job", lambda state, job_id: 0)
    assert "has ended" in _bind(fleet, first, node)
    assert kube.bindings == []
    assert _live(fleet) == []
    monkeypatch.setattr(allocations, "count_for_job", count)
    assert _bind(fleet, first, node) == ""
    (after,) = _live(fleet)
    assert after["id"] != gang["id"]
