"""A device report read while a pod ran, taken after the pod ended (the watch or the
reconciler released it) and its GPUs went on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from placement.profiles import build_profile
from service.k8s.pod_watch import PodWatcher, followed
from service.k8s.reconcile import reconcile_once
from service.state import ServiceState
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODE = "h100-a"
LIVE = ("pending", "active", "degraded")


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(k8s_client, ("hgx-h100", NODE))
    return k8s_client


def _bound(client: TestClient, kube: FakeKubeApi, name: str, gpus: int) -> dict[str, Any]:
    p = kube.add(pod(name, gpus))
    assert client.post("/k8s/v1/filter", json=names_args(p, [NODE])).json()["NodeNames"] == [NODE]
    assert client.post("/k8s/v1/bind", json=binding_args(p, NODE)).json() == {"Error": ""}
    kube.start("ml-team", name, datetime.now(UTC) - timedelta(seconds=10))
    found = kube.get_pod("ml-team", name)
    assert found is not None
    return found


def _place(client: TestClient, gpus: int) -> str:
    answer = client.post("/v1/place", json={"gpus": gpus, "nodes": [NODE]})
    assert answer.status_code == 201, answer.text
    allocation_id: str = answer.json()["id"]
    return allocation_id


def _state_of(client: TestClient, allocation_id: str) -> str:
    found: str = client.get(f"/v1/allocations/{allocation_id}").json()["state"]
    return found


@pytest.mark.parametrize("ended_by", ["watch", "reconciler"])
def test_a_report_of_a_pod_that_ended_meanwhile_holds_nothing_for_it(
    fleet: TestClient, kube: FakeKubeApi, ended_by: str
) -> None:
    """The report reads the pod (running), then the pod is deleted: the watch releases its
    reservation (or, with no watch, the reconciler's pass does) and the node's GPUs go
    to other work. The report's truth of the pod, taken after, must write nothing: no
    allocation for a pod that is gone, and none of the work now on those GPUs released
    as the dead pod's stale holder. With the reconciler, the gone pod was made an
    allocation on the GPUs the kubelet had given it, and one of the two 2-GPU
    allocations placed since was released."""
    first = _bound(fleet, kube, "first", 2)
    uid = first["metadata"]["uid"]
    reserved = first["metadata"]["annotations"]["topoplace.io/gpus"].split(",")
    others = _place(fleet, 4)  # the node's other work
    state: ServiceState = fleet.app.state.service  # type: ignore[attr-defined]
    extender = fleet.app.state.k8s  # type: ignore[attr-defined]
    watcher = PodWatcher(state, extender.gangs, stream=None)  # type: ignore[arg-type]
    kept = followed(first)
    assert kept is not None
    watcher.pods[uid] = kept  # the watch follows the bound pod
    held = set(_gpus_of(fleet, others)) | set(reserved)
    given = [g.uuid for g in build_profile("hgx-h100", NODE).gpus if g.uuid not in held]
    assert len(given) == 2  # the kubelet chose otherwise than reserved
    after: list[str] = []
    read = kube.get_pod

    def read_then_ended(namespace: str, name: str) -> dict[str, Any] | None:
        found = read(namespace, name)
        if name == "first" and not after:
            kube.delete(namespace, name)
            if ended_by == "watch":
                asyncio.run(watcher._event({"type": "DELETED", "object": first}))
            else:
                released = reconcile_once(state, kube, extender.gangs, 0.0)
                assert len(released) == 1
            after.extend([_place(fleet, 2), _place(fleet, 2)])  # the freed GPUs go on
        return found

    kube.get_pod = read_then_ended  # type: ignore[method-assign]
    body = {
        "resource": "nvidia.com/gpu",
        "pods": [{"namespace": "ml-team", "name": "first", "devices": given}],
        "listed_at": datetime.now(UTC).isoformat(),
    }
    answer = fleet.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)
    assert answer.status_code == 200, answer.text
    assert [_state_of(fleet, a) in LIVE for a in [others, *after]] == [True] * 3
    (outcome,) = answer.json()["outcomes"]
    assert outcome["action"] == "deferred", outcome
    found = fleet.get("/v1/allocations", params={"job_id": uid}).json()["allocations"]
    assert [a["state"] for a in found if a["state"] in LIVE] == []


def _gpus_of(client: TestClient, allocation_id: str) -> list[str]:
    found = client.get(f"/v1/allocations/{allocation_id}").json()
    return [u for t in found["tasks"] for u in t["gpu_uuids"]]
