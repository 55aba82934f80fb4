"""Pods taken through the extender as kube-scheduler takes them, then admitted."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from tests.service.k8s.fake_kube import FakeKubeApi


def bound_and_started(
    client: TestClient, kube: FakeKubeApi, node: str, name: str, gpus: int, **notes: str
) -> dict[str, Any]:
    """A pod of ml-team filtered to ``node``, bound there and admitted by its kubelet (the
    node's device report names its devices): the pod as the API server then holds it."""
    p = kube.add(pod(name, gpus, annotations=notes or None))
    assert client.post("/k8s/v1/filter", json=names_args(p, [node])).json()["NodeNames"] == [node]
    assert client.post("/k8s/v1/bind", json=binding_args(p, node)).json() == {"Error": ""}
    kube.start("ml-team", name)
    return kube.get_pod("ml-team", name) or {}
