"""A device report read while a pod ran, taken after the reconciler gave its GPUs back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from placement.profiles import build_profile
from service.k8s.reconcile import reconcile_once
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


def _gpus_of(client: TestClient, allocation_id: str) -> list[str]:
    found = client.get(f"/v1/allocations/{allocation_id}").json()
    return [u for t in found["tasks"] for u in t["gpu_uuids"]]


def _state_of(client: TestClient, allocation_id: str) -> str:
    found: str = client.get(f"/v1/allocations/{allocation_id}").json()["state"]
    return found


def test_a_report_of_a_pod_the_reconciler_released_meanwhile_holds_nothing_for_it(
    fleet: TestClient, kube: FakeKubeApi
) -> None:
    """With no pod watch, the reconciler is what gives a deleted pod's GPUs back. A
    device report that read the pod running, then is taken after the pod was deleted
    and the reconciler's pass released its reservation (the GPUs gone to other work),
    must write nothing for the gone pod: no allocation made for it on the GPUs the
    kubelet had given it, and none of the work now on them released as its stale
    holder."""
    first = _bound(fleet, kube, "first", 2)
    uid = first["metadata"]["uid"]
    reserved = first["metadata"]["annotations"]["topoplace.io/gpus"].split(",")
    others = _place(fleet, 4)  # the node's other work
    held = set(_gpus_of(fleet, others)) | set(reserved)
    given = [g.uuid for g in build_profile("hgx-h100", NODE).gpus if g.uuid not in held]
    assert len(given) == 2  # the kubelet chose otherwise than reserved
    app: Any = fleet.app
    after: list[str] = []
    read = kube.get_pod

    def read_then_reconciled(namespace: str, name: str) -> dict[str, Any] | None:
        found = read(namespace, name)
        if name == "first" and not after:
            kube.delete(namespace, name)
            released = reconcile_once(app.state.service, kube, app.state.k8s.gangs, 0.0)
            assert len(released) == 1
            after.extend([_place(fleet, 2), _place(fleet, 2)])  # the freed GPUs go on
        return found

    kube.get_pod = read_then_reconciled  # type: ignore[method-assign]
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
