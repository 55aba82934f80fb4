"""A pod the kubelet gave devices of two resources is reported once per resource.

The device plugin lists the kubelet's pods per resource and reports each resource
apart. A pod no topoplace filter let through (another scheduler bound it) may ask
for two MIG profiles; its report under the second resource must not move the
allocation the first one made, or each round moves it back and forth and the
devices of the other resource look free in between.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from bench.k8s_objects import pod
from placement.profiles import build_profile
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODE = "mig-b"


def _held(client: TestClient) -> list[str]:
    listed = client.get("/v1/allocations", params={"node": NODE}).json()["allocations"]
    return sorted(
        m
        for a in listed
        if a["state"] in ("pending", "active", "degraded")
        for t in a["tasks"]
        for m in t["mig_uuids"]
    )


def _report(client: TestClient, resource: str, device: str) -> dict[str, Any]:
    body = {
        "resource": resource,
        "pods": [{"namespace": "ml-team", "name": "two", "devices": [device]}],
    }
    answer = client.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)
    assert answer.status_code == 200, answer.text
    (outcome,) = answer.json()["outcomes"]
    return dict(outcome)


def test_a_pods_report_of_its_second_resource_leaves_its_first_ones_devices_held(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    add_nodes(k8s_client, ("dgx-a100-mig", NODE))
    snapshot = build_profile("dgx-a100-mig", NODE)
    first, second = sorted({m.profile for m in snapshot.mig_instances})[:2]
    a = next(m.uuid for m in snapshot.mig_instances if m.profile == first)
    b = next(m.uuid for m in snapshot.mig_instances if m.profile == second)
    p = pod("two", 1, resource=f"nvidia.com/mig-{first}")
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    limits[f"nvidia.com/mig-{second}"] = "1"
    p["spec"]["nodeName"] = NODE  # bound by another scheduler: topoplace refuses two kinds
    kube.add(p)
    kube.start("ml-team", "two")
    created = _report(k8s_client, f"nvidia.com/mig-{first}", a)
    assert created["action"] == "created"
    for _ in range(2):  # two truth rounds
        other = _report(k8s_client, f"nvidia.com/mig-{second}", b)
        assert other["action"] == "unmatched", other
        assert f"nvidia.com/mig-{first}" in other["message"]
        assert other["allocation_id"] == created["allocation_id"]
        assert _held(k8s_client) == [a]
        again = _report(k8s_client, f"nvidia.com/mig-{first}", a)
        assert again["action"] == "matched", again
    counts = k8s_client.get("/v1/k8s/mismatches").json()["counts"]
    assert counts["moved"] == 0 and counts["unmatched"] == 1
