"""The NodeResourceTopology object: zones per NUMA node, the node's labels, kept in the API."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import yaml

from agent.deviceplugin.devices import advertised
from agent.deviceplugin.kube_publish import PublishError, TopologyPublisher
from agent.deviceplugin.topology_object import node_resource_topology
from placement.profiles import build_profile
from tests.agent.deviceplugin.harness import ROOT


def _object() -> dict[str, Any]:
    snap = build_profile("hgx-h100", "gpu-7")
    devices = {"nvidia.com/gpu": advertised(snap, "nvidia.com/gpu")}
    held = {snap.gpus[0].uuid, snap.gpus[1].uuid}
    return node_resource_topology(snap, devices, held)


def test_zones_count_each_numa_nodes_gpus():
    obj = _object()
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert obj["metadata"] == {"name": "gpu-7"}
    zones = {z["name"]: z for z in obj["zones"]}
    assert set(zones) == {"node-0", "node-1"}
    gpus = {name: z["resources"][0] for name, z in zones.items()}
    assert sum(r["capacity"] for r in gpus.values()) == 8
    assert all(r["allocatable"] == r["capacity"] for r in gpus.values())
    assert sum(r["available"] for r in gpus.values()) == 6  # two held by pods
    attributes = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attributes["topology.k8s.io/nvlink.islands"] == "1"
    assert attributes["topology.k8s.io/nvlink.island-size"] == "8"
    assert attributes["topoplace.io/gpu.count"] == "8"


def test_the_object_fits_the_shipped_crd():
    crd = yaml.safe_load(
        (ROOT / "integrations/kubernetes/noderesourcetopology-crd.yaml").read_text()
    )
    (version,) = [v for v in crd["spec"]["versions"] if v["storage"]]
    assert f"{crd['spec']['group']}/{version['name']}" == _object()["apiVersion"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert set(_object()) <= set(schema)
    zone = schema["zones"]["items"]["properties"]
    assert set(_object()["zones"][0]) <= set(zone)
    assert set(_object()["zones"][0]["resources"][0]) == set(zone["resources"]["items"]["required"])


def test_the_publisher_creates_then_replaces_with_the_version_read():
    stored: dict[str, Any] = {}
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if request.method == "GET":
            if not stored:
                return httpx.Response(404, json={"kind": "Status", "code": 404})
            return httpx.Response(200, json=stored)
        body = json.loads(request.content)
        if request.method == "PUT":
            assert body["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
        stored.clear()
        stored.update(body)
        stored["metadata"]["resourceVersion"] = str(len(calls))
        return httpx.Response(201 if request.method == "POST" else 200, json=stored)

    publisher = TopologyPublisher(
        httpx.Client(base_url="https://api", transport=httpx.MockTransport(handler))
    )
    obj = _object()
    assert publisher.publish(obj)
    assert not publisher.publish(obj)  # unchanged: nothing sent
    changed = {**obj, "attributes": []}
    assert publisher.publish(changed)
    assert calls == ["GET", "POST", "GET", "PUT"]


def test_a_refusal_is_an_error_that_names_it():
    publisher = TopologyPublisher(
        httpx.Client(
            base_url="https://api",
            transport=httpx.MockTransport(lambda r: httpx.Response(403, text="forbidden")),
        )
    )
    with pytest.raises(PublishError, match="403"):
        publisher.publish(_object())


def test_pcie_groups_are_not_counted_as_nvlink_islands():
    from agent.deviceplugin.topology_object import node_attributes

    pcie = node_attributes(build_profile("pcie-8x-l40s", "l0"))
    assert pcie["topology.k8s.io/nvlink.islands"] == "0"
    assert pcie["topology.k8s.io/nvlink.island-size"] == "1"
    dgx1 = node_attributes(build_profile("dgx1-v100", "d0"))
    assert dgx1["topology.k8s.io/nvlink.islands"] == "1"
    assert dgx1["topology.k8s.io/nvlink.island-size"] == "8"
