"""The device plugin's routes take its node's agent token, and only for that node (or
its region, as the database holds it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from bench.k8s_objects import pod
from service import schema
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock, secured
from tests.service.deaf_replicas import deaf_listener, held, replica  # noqa: F401
from tests.service.k8s.fake_kube import FakeKubeApi
from tests.service.test_access_scope import ADMIN, bearer, new_token, snapshot_body, trusting


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(trusting(tmp_path / "plugin.sqlite3"), background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    with TestClient(app) as c:
        yield c


def test_an_agent_token_reads_and_reports_its_own_node_only(client: TestClient) -> None:
    for name in ("node-a", "node-b"):
        answer = client.put(f"/v1/nodes/{name}/snapshot", json=snapshot_body(name), headers=ADMIN)
        assert answer.status_code == 200, answer.text
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))
    report = {"resource": "nvidia.com/gpu", "pods": []}

    mine = client.get("/v1/nodes/node-a/k8s/reservations", headers=agent)
    assert mine.status_code == 200, mine.text
    assert mine.json() == {"node": "node-a", "reservations": []}
    assert (
        client.post("/v1/nodes/node-a/k8s/devices", json=report, headers=agent).status_code == 200
    )

    refused = [
        client.get("/v1/nodes/node-b/k8s/reservations", headers=agent),
        client.post("/v1/nodes/node-b/k8s/devices", json=report, headers=agent),
        client.get("/v1/k8s/mismatches", headers=agent),  # a read: viewers and up
    ]
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "forbidden"
    assert client.get("/v1/nodes/node-a/k8s/reservations").status_code == 401
    viewer = bearer(new_token(client, role="viewer"))
    assert client.get("/v1/k8s/mismatches", headers=viewer).status_code == 200


@pytest.mark.usefixtures("deaf_listener")
def test_a_region_agent_reports_no_devices_of_a_node_moved_to_another_region_on_another_replica(
    settings: Settings, clock: FakeClock, kube: FakeKubeApi
) -> None:
    """The token check reads the node's region from the replica's memory: a replica that
    has not heard of the node's move out of the agent's region would let the agent's device
    report move the allocations of a node its region no longer holds."""
    secure = secured(settings)
    with replica(secure, clock, kube) as first:
        answer = first.put("/v1/nodes/n1/snapshot", json=snapshot_body("n1", "us"), headers=ADMIN)
        assert answer.status_code == 200, answer.text
        us_agent = bearer(new_token(first, role="agent", region="us"))
        with replica(secure, clock, kube) as behind:
            state: ServiceState = behind.app.state.service  # type: ignore[attr-defined]
            empty = {"resource": "nvidia.com/gpu", "pods": []}
            mine = behind.post("/v1/nodes/n1/k8s/devices", json=empty, headers=us_agent)
            assert mine.status_code == 200, mine.text  # its region's node, while it is
            # An admin moves the node to region "eu" through the first replica; its pod
            # runs on GPU 0 there, as the kubelet says.
            moved = first.put(
                "/v1/nodes/n1/snapshot", json=snapshot_body("n1", "eu", seq=2), headers=ADMIN
            )
            assert moved.status_code == 200, moved.text
            gpus = [g.uuid for g in state.cluster.node("n1").snapshot.gpus]
            assert state.cluster.node("n1").snapshot.region == "us"  # not heard of it yet
            p = pod("web-0", 1)
            p["spec"]["nodeName"] = "n1"
            p["status"]["startTime"] = "2026-11-29T10:21:09Z"
            kube.add(p)
            truth = _devices("web-0", gpus[0])
            answer = first.post("/v1/nodes/n1/k8s/devices", json=truth, headers=ADMIN)
            assert answer.status_code == 200, answer.text
            assert held(first) == {("n1", gpus[0])}
            # The old region's agent, through the replica behind, says the pod is on GPU 1.
            false = behind.post(
                "/v1/nodes/n1/k8s/devices", json=_devices("web-0", gpus[1]), headers=us_agent
            )
            assert false.status_code == 403, false.text
            assert false.json()["error"]["code"] == "forbidden"
            assert held(first) == {("n1", gpus[0])}


def _devices(pod_name: str, device: str) -> dict[str, Any]:
    pods = [{"namespace": "ml-team", "name": pod_name, "devices": [device]}]
    return {"resource": "nvidia.com/gpu", "pods": pods}


@pytest.fixture
def guarded(settings: Settings, clock: FakeClock, kube: FakeKubeApi) -> Iterator[TestClient]:
    """The service behind its token check (no token: 401), with the fake Kubernetes API."""
    app = create_app(secured(settings), clock=clock, background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    app.state.k8s_api = kube
    with TestClient(app) as c:
        yield c


def test_a_nodes_device_report_ends_no_allocation_it_shares_with_another_node(
    guarded: TestClient, kube: FakeKubeApi
) -> None:
    """Node a's agent token reports a pod of node a on a GPU that a two-node allocation holds
    there. Taking that truth ended the whole allocation, node b's 8 GPUs freed under its
    running task: node a's token changed node b. The pod's report is unmatched instead, and
    the allocation keeps both nodes."""
    client = guarded
    for name in ("node-a", "node-b"):
        answer = client.put(f"/v1/nodes/{name}/snapshot", json=snapshot_body(name), headers=ADMIN)
        assert answer.status_code == 200, answer.text
    scheduler = bearer(new_token(client, role="scheduler"))
    both = client.post(
        "/v1/place", json={"gpus": 8, "tasks": 2, "job_id": "wide"}, headers=scheduler
    ).json()
    assert sorted(t["node"] for t in both["tasks"]) == ["node-a", "node-b"]
    assert client.post(f"/v1/allocations/{both['id']}/confirm", headers=scheduler).is_success
    p = pod("web-0", 1)
    p["spec"]["nodeName"] = "node-a"
    p["status"]["startTime"] = "2026-11-29T10:21:09Z"
    kube.add(p)
    on_a = next(t for t in both["tasks"] if t["node"] == "node-a")["gpu_uuids"][0]
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))

    answer = client.post(
        "/v1/nodes/node-a/k8s/devices", json=_devices("web-0", on_a), headers=agent
    )

    assert answer.status_code == 200, answer.text
    (outcome,) = answer.json()["outcomes"]
    assert outcome["action"] == "unmatched", outcome
    assert "another node" in outcome["message"]
    assert both["id"] not in outcome["message"]  # nothing learnt of another node's jobs
    after = client.get(f"/v1/allocations/{both['id']}", headers=scheduler).json()
    assert after["state"] == "active"
    assert after["tasks"] == both["tasks"]
    # Node b's GPUs are still held: a job asking for them there does not fit.
    refused = client.post("/v1/place", json={"gpus": 8, "nodes": ["node-b"]}, headers=scheduler)
    assert refused.status_code == 409, refused.text


def test_a_nodes_report_learns_nothing_of_pods_that_do_not_run_there(
    guarded: TestClient, kube: FakeKubeApi
) -> None:
    """A node's agent token may name any pod in its report, and the service reads each from
    the Kubernetes API with its own account: the answer told apart a pod that exists
    nowhere ("gone"), one not bound ("not bound") and one bound to another node, so the
    token learnt which pod names exist in every namespace, which the node's own kubelet
    may not read. One answer for the three now."""
    client = guarded
    answer = client.put("/v1/nodes/node-a/snapshot", json=snapshot_body("node-a"), headers=ADMIN)
    assert answer.status_code == 200, answer.text
    elsewhere, unbound = pod("elsewhere", 1), pod("unbound", 1)
    elsewhere["spec"]["nodeName"] = "node-b"
    elsewhere["status"]["startTime"] = "2026-11-29T10:21:09Z"
    kube.add(elsewhere)
    kube.add(unbound)
    device = snapshot_body("node-a")["snapshot"]["gpus"][0]["uuid"]
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))
    messages = {}
    for name in ("elsewhere", "unbound", "nowhere"):
        body = _devices(name, device)
        answer = client.post("/v1/nodes/node-a/k8s/devices", json=body, headers=agent)
        assert answer.status_code == 200, answer.text
        (outcome,) = answer.json()["outcomes"]
        assert outcome["action"] == "deferred", outcome
        messages[name] = outcome["message"]
    assert len(set(messages.values())) == 1, messages
    assert "node-a" in messages["nowhere"]


def test_an_agent_adds_no_order_row_per_resource_name_it_invents(client: TestClient) -> None:
    """Each report's List time is kept per node and resource: were it kept under any name
    an agent sends, each invented name would add a row. Whole GPUs keep one row whatever
    the plugin calls them (``--gpu-resource``); a MIG resource is one of the node's."""
    answer = client.put("/v1/nodes/node-a/snapshot", json=snapshot_body("node-a"), headers=ADMIN)
    assert answer.status_code == 200, answer.text
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))
    at = "2026-06-01T12:00:00+00:00"
    for resource in ("nvidia.com/gpu", "example.com/gpu", "example.com/gpu-2"):
        report: dict[str, Any] = {"resource": resource, "pods": [], "listed_at": at}
        answer = client.post("/v1/nodes/node-a/k8s/devices", json=report, headers=agent)
        assert answer.status_code == 200, answer.text
    report = {"resource": "nvidia.com/mig-9g.99gb", "pods": [], "listed_at": at}
    answer = client.post("/v1/nodes/node-a/k8s/devices", json=report, headers=agent)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "bad_request"
    assert "no MIG instance" in answer.json()["error"]["message"]
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    with state.engine.connect() as conn:
        rows = conn.execute(sa.select(schema.k8s_report_order.c.resource)).scalars().all()
    assert rows == ["nvidia.com/gpu"]
