"""preempt keeps only the nodes where evicting the proposed victims lets the pod fit."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import pod
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi


@pytest.fixture
def fleet(k8s_client: TestClient, kube: FakeKubeApi) -> dict[str, dict[str, Any]]:
    add_nodes(k8s_client, ("hgx-h100", "h100-a"), ("pcie-8x-l40s", "l40s-b"))
    victims = {}
    for name, node, gpus in (("old-a", "h100-a", 8), ("old-b", "l40s-b", 8)):
        p = kube.add(pod(name, gpus))
        meta = p["metadata"]
        args = {
            "PodName": name,
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        assert k8s_client.post("/k8s/v1/bind", json=args).json() == {"Error": ""}
        victims[node] = p
    return victims


def test_only_nodes_where_eviction_helps_are_kept(k8s_client: TestClient, fleet: dict[str, Any]):
    waiting = pod("urgent", 4, annotations={"topoplace.io/locality": "nvlink"})
    meta = {
        node: {"Pods": [{"UID": p["metadata"]["uid"]}], "NumPDBViolations": 0}
        for node, p in fleet.items()
    }
    body = {"Pod": waiting, "NodeNameToVictims": None, "NodeNameToMetaVictims": meta}
    response = k8s_client.post("/k8s/v1/preempt", json=body)
    assert response.status_code == 200, response.text
    # Freeing the L40S box gives 8 GPUs but never 4 connected by NVLink.
    assert response.json() == {"NodeNameToMetaVictims": {"h100-a": meta["h100-a"]}}
    # Nothing was actually freed.
    assert k8s_client.get("/v1/nodes/h100-a").json()["free_gpus"] == []


def test_victims_that_hold_no_gpus_do_not_help(k8s_client: TestClient, fleet: dict[str, Any]):
    waiting = pod("urgent", 4)
    bystander = pod("web", 0)
    full = {"h100-a": {"Pods": [bystander], "NumPDBViolations": 0}}
    body = {"Pod": waiting, "NodeNameToVictims": full, "NodeNameToMetaVictims": None}
    assert k8s_client.post("/k8s/v1/preempt", json=body).json() == {"NodeNameToMetaVictims": {}}


def test_full_victim_objects_are_read_by_uid(k8s_client: TestClient, fleet: dict[str, Any]):
    waiting = pod("urgent", 8)
    full = {"l40s-b": {"Pods": [fleet["l40s-b"]], "NumPDBViolations": 1}}
    body = {"Pod": waiting, "NodeNameToVictims": full, "NodeNameToMetaVictims": None}
    kept = k8s_client.post("/k8s/v1/preempt", json=body).json()["NodeNameToMetaVictims"]
    assert kept == {
        "l40s-b": {"Pods": [{"UID": fleet["l40s-b"]["metadata"]["uid"]}], "NumPDBViolations": 1}
    }
