"""GPUs of pods that are deleted or finished are released; young reservations are left alone."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, pod
from service import schema
from service.allocations import api as allocations
from service.errors import Unavailable
from service.k8s.reconcile import reconcile_once
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi


def _bind(client: TestClient, p: dict[str, Any], node: str) -> None:
    args = binding_args(p, node)
    assert client.post("/k8s/v1/bind", json=args).json() == {"Error": ""}


def _reconcile(client: TestClient, kube: FakeKubeApi, grace_s: float = 60.0) -> list[str]:
    app: Any = client.app
    return reconcile_once(app.state.service, kube, app.state.k8s.gangs, grace_s)


def test_deleted_and_finished_pods_give_their_gpus_back(
    k8s_client: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    running, done, deleted = (kube.add(pod(n, 2)) for n in ("running", "done", "deleted"))
    for p in (running, done, deleted):
        _bind(k8s_client, p, "h100-a")
    kube.pods[("ml-team", "done")]["status"]["phase"] = "Succeeded"
    kube.delete("ml-team", "deleted")

    assert _reconcile(k8s_client, kube) == []  # too young: a bind may still be running
    clock.advance(61)
    released = _reconcile(k8s_client, kube)
    assert len(released) == 2
    states = {
        a["job_id"]: a["state"] for a in k8s_client.get("/v1/allocations").json()["allocations"]
    }
    assert states == {
        running["metadata"]["uid"]: "active",
        done["metadata"]["uid"]: "released",
        deleted["metadata"]["uid"]: "released",
    }
    assert len(k8s_client.get("/v1/nodes/h100-a").json()["free_gpus"]) == 6
    assert _reconcile(k8s_client, kube) == []


def test_reservations_made_outside_kubernetes_are_not_touched(
    k8s_client: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    assert k8s_client.post("/v1/place", json={"gpus": 2, "owner": "slurm"}).status_code == 201
    clock.advance(3600)
    assert _reconcile(k8s_client, kube) == []


def test_a_gang_is_released_when_no_member_is_left(
    k8s_client: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    notes = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}
    members = [kube.add(pod(f"pair-{i}", 4, annotations=notes)) for i in range(2)]
    for p in members:
        _bind(k8s_client, p, "h100-a")
    clock.advance(120)
    kube.delete("ml-team", "pair-0")
    assert _reconcile(k8s_client, kube) == []  # pair-1 still runs
    kube.delete("ml-team", "pair-1")
    assert len(_reconcile(k8s_client, kube)) == 1
    assert len(k8s_client.get("/v1/nodes/h100-a").json()["free_gpus"]) == 8


def test_a_reservation_on_a_node_its_pod_is_not_bound_to_is_released_after_the_grace(
    k8s_client: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    # A bind to h100-b reserved there, its pod was bound to h100-a by a retried bind,
    # and the process died before it gave the h100-b reservation back.
    add_nodes(k8s_client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"))
    moved = kube.add(pod("moved", 2))
    _bind(k8s_client, moved, "h100-a")
    uid = moved["metadata"]["uid"]
    body = {"gpus": 2, "owner": "k8s-pod:ml-team/moved", "job_id": uid, "nodes": ["h100-b"]}
    stale = k8s_client.post("/v1/place", json=body).json()["id"]
    assert _reconcile(k8s_client, kube) == []  # young: its Binding may be under way
    clock.advance(61)
    assert _reconcile(k8s_client, kube) == [stale]  # the reservation the pod runs on stays
    assert len(k8s_client.get("/v1/nodes/h100-b").json()["free_gpus"]) == 8


def test_a_reservation_whose_pod_never_bound_is_released_after_the_grace(
    k8s_client: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    # A bind reserves (active at once), then the process dies before the Binding.
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    bound = kube.add(pod("bound", 2))
    _bind(k8s_client, bound, "h100-a")
    waiting = kube.add(pod("waiting", 2))
    uid = waiting["metadata"]["uid"]
    body = {"gpus": 2, "owner": "k8s-pod:ml-team/waiting", "job_id": uid}
    assert k8s_client.post("/v1/place", json=body).status_code == 201
    assert _reconcile(k8s_client, kube) == []  # young: its Binding may be under way
    clock.advance(61)
    (released,) = _reconcile(k8s_client, kube)  # the bound pod keeps its GPUs
    assert k8s_client.get(f"/v1/allocations/{released}").json()["job_id"] == uid


def test_a_gang_whose_confirms_failed_is_confirmed_once_its_members_are_bound(
    k8s_client: TestClient, kube: FakeKubeApi, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
):
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    notes = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}
    members = [kube.add(pod(f"pair-{i}", 4, annotations=notes)) for i in range(2)]

    def blinked(state: object, allocation_id: str) -> None:
        raise Unavailable("the database blinked")

    with monkeypatch.context() as patched:
        patched.setattr(allocations, "confirm", blinked)
        for p in members:  # both bound; each confirm after its Binding failed
            _bind(k8s_client, p, "h100-a")
    gang = {"job_id": "k8s-gang:ml-team/pair"}
    (reserved,) = k8s_client.get("/v1/allocations", params=gang).json()["allocations"]
    assert reserved["state"] == "pending"
    _reconcile(k8s_client, kube)
    state = k8s_client.get(f"/v1/allocations/{reserved['id']}").json()["state"]
    assert state == "active", "its members run on its GPUs: no TTL may end it"
    clock.advance(3600)
    app: Any = k8s_client.app
    allocations.sweep(app.state.service)
    assert k8s_client.get(f"/v1/allocations/{reserved['id']}").json()["state"] == "active"


def _made_outside_kubernetes(client: TestClient, clock: FakeClock, count: int) -> None:
    """``count`` live allocations of a Slurm user, each newer than the last, written
    straight into the database (one /place each would take minutes): copies of one
    real allocation's request and placement, each holding a GPU of its own."""
    body = {"gpus": 1, "owner": "slurm:alice", "nodes": ["h100-b"]}
    model = client.post("/v1/place", json=body).json()["id"]
    app: Any = client.app
    engine: sa.Engine = app.state.service.engine
    table, holds = schema.allocations, schema.gpu_holds
    with engine.begin() as conn:
        row = conn.execute(sa.select(table).where(table.c.id == model)).mappings().one()
        rows = [
            {
                **row,
                "id": f"outside-{i:05d}",
                "state": "active",  # as the Kubernetes reservation is
                "expires_at": None,
                "idempotency_key": None,
                "created_at": clock.now + timedelta(microseconds=i + 1),
                "anchor_node": "elsewhere",
                "anchor_device": f"GPU-{i:05d}",
            }
            for i in range(count)
        ]
        conn.execute(sa.insert(table), rows)
        conn.execute(
            sa.insert(holds),
            [
                {"node": "elsewhere", "device": f"GPU-{i:05d}", "kind": "gpu"}
                | {"allocation_id": f"outside-{i:05d}", "live": True}
                for i in range(count)
            ],
        )


def test_every_live_reservation_is_reconciled_however_many_others_are_live(
    k8s_client: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    """The pass read the newest 10,000 allocations of each live state and kept the
    Kubernetes ones among them: behind 10,000 newer allocations of others, a pod's
    reservation was never looked at again, and its GPUs never came back."""
    add_nodes(k8s_client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"))
    gone = kube.add(pod("gone", 2))
    _bind(k8s_client, gone, "h100-a")
    clock.advance(1)
    _made_outside_kubernetes(k8s_client, clock, 10_000)
    kube.delete("ml-team", "gone")
    clock.advance(61)
    (released,) = _reconcile(k8s_client, kube)
    assert k8s_client.get(f"/v1/allocations/{released}").json()["job_id"] == gone["metadata"]["uid"]
    assert len(k8s_client.get("/v1/nodes/h100-a").json()["free_gpus"]) == 8
