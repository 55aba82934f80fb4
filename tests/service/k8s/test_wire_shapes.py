"""Extender bodies of the wrong shape are 400 in the error shape, never a fault."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}, "spec": {}}
GPU = {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
GPU_POD = {**POD, "spec": GPU}


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("preempt", {"Pod": POD, "NodeNameToVictims": 1.5}),
        ("preempt", {"Pod": POD, "NodeNameToVictims": {"n0": []}}),
        ("preempt", {"Pod": POD, "NodeNameToMetaVictims": {"n0": {"Pods": 3}}}),
        ("prioritize", {"Pod": POD, "NodeNames": ["n0"], "Nodes": True}),
        ("filter", {"Pod": POD, "Nodes": ""}),
        ("bind", {"PodName": "p\u0000", "PodNamespace": "d", "PodUID": "u", "Node": "n0"}),
        # Postgres refuses NUL in any query parameter: found in a victim, never a 500.
        (
            "preempt",
            {"Pod": GPU_POD, "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "u\u0000"}]}}},
        ),
        (
            "preempt",
            {"Pod": GPU_POD, "NodeNameToMetaVictims": {"n\u0000": {"Pods": [{"UID": "u"}]}}},
        ),
        (
            "preempt",
            {
                "Pod": GPU_POD,
                "NodeNameToVictims": {"n0": {"Pods": [{"metadata": {"uid": "\u0007"}}]}},
            },
        ),
    ],
)
def test_wrong_shapes_are_bad_requests(
    k8s_client: TestClient, route: str, body: dict[str, Any]
) -> None:
    response = k8s_client.post(f"/k8s/v1/{route}", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_request"


def test_meta_victims_are_answered_in_their_documented_shape(k8s_client: TestClient) -> None:
    body = {"Pod": POD, "NodeNameToMetaVictims": {"n0": {}}}
    answer = k8s_client.post("/k8s/v1/preempt", json=body).json()
    for victims in answer["NodeNameToMetaVictims"].values():
        assert set(victims) == {"Pods", "NumPDBViolations"}


@pytest.mark.parametrize(
    "pod",
    [
        {"metadata": [], "spec": {}},
        {"metadata": {"name": "p"}, "spec": {"containers": {"a": 1}}},
        {"metadata": {"name": "p\u0000"}, "spec": {}},
        {"metadata": {"name": "p", "annotations": "x"}, "spec": {}},
        # Read for the pod's cache key before it is parsed: no shape may be taken for granted.
        {"metadata": "x", "spec": GPU},
        {"metadata": 1.5, "spec": GPU},
        {"metadata": True, "spec": GPU},
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_odd_pods_are_not_faults(k8s_client: TestClient, pod: dict[str, Any], verb: str) -> None:
    response = k8s_client.post(f"/k8s/v1/{verb}", json={"Pod": pod, "NodeNames": ["n0"]})
    assert response.status_code < 500, response.text


@pytest.mark.parametrize("metadata", ["x", 1.5, None, []])
def test_a_victim_whose_metadata_is_not_an_object_is_not_a_fault(
    k8s_client: TestClient, metadata: Any
) -> None:
    body = {"Pod": GPU_POD, "NodeNameToVictims": {"n0": {"Pods": [{"metadata": metadata}]}}}
    response = k8s_client.post("/k8s/v1/preempt", json=body)
    assert response.status_code < 500, response.text
