"""The kubelet's truth taken by a replica behind a node deleted and reported again under
its old seq with other GPUs (a board replaced, an agent started afresh).

The replica behind has not heard of the delete or of the new report (its notification
is on the way): its memory holds the old GPUs, and the seq alone matches the stored
one again. A report naming a GPU the node no longer has is refused, never held; one
naming the GPUs the node has now is taken on them: the replica reads the node again
rather than refusing what the stored snapshot offers.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import pod
from placement import NodeSnapshot
from placement.profiles import build_profile
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import deaf_listener, held, replica  # noqa: F401
from tests.service.helpers import report
from tests.service.k8s.fake_kube import FakeKubeApi

NODE = "h0"


pytestmark = pytest.mark.usefixtures("deaf_listener")


def _held(client: TestClient) -> set[str]:
    return {device for _, device in held(client)}


def _on_node(p: dict[str, Any]) -> dict[str, Any]:
    """``p`` as bound to the node by hand and started by its kubelet."""
    p["spec"]["nodeName"] = NODE
    p["status"]["startTime"] = "2026-11-29T10:21:09Z"
    return p


@contextlib.contextmanager
def _reported_again(
    settings: Settings, clock: FakeClock, kube: FakeKubeApi, cordon: bool
) -> Iterator[tuple[TestClient, TestClient, NodeSnapshot, NodeSnapshot]]:
    """(the replica that deleted the node and stored it again, the replica behind, the
    old snapshot, the new one): the same seq, no GPU in common."""
    old = build_profile("hgx-h100", NODE)
    new = build_profile("hgx-h100", "other").model_copy(update={"name": NODE})
    assert old.seq == new.seq and {g.uuid for g in old.gpus}.isdisjoint(g.uuid for g in new.gpus)
    with replica(settings, clock, kube) as first:
        assert report(first, old).status_code == 200
        with replica(settings, clock, kube) as behind:
            assert first.delete(f"/v1/nodes/{NODE}").status_code == 204
            clock.advance(1)
            assert report(first, new).status_code == 200
            if cordon:
                # What the kubelet runs on a cordoned node is held all the same.
                assert first.post(f"/v1/nodes/{NODE}/cordon").status_code == 200
            state: ServiceState = behind.app.state.service  # type: ignore[attr-defined]
            assert state.cluster.node(NODE).snapshot.gpus[0].uuid == old.gpus[0].uuid
            yield first, behind, old, new


def _devices(client: TestClient, uuid: str) -> Any:
    body = {
        "resource": "nvidia.com/gpu",
        "pods": [{"namespace": "ml-team", "name": "manual", "devices": [uuid]}],
    }
    return client.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)


@pytest.mark.parametrize("cordon", [False, True], ids=["uncordoned", "cordoned"])
def test_a_gpu_the_node_no_longer_has_is_not_held_through_a_replica_behind(
    settings: Settings, clock: FakeClock, cordon: bool
) -> None:
    kube = FakeKubeApi()
    with _reported_again(settings, clock, kube, cordon) as (_, behind, old, _new):
        kube.add(_on_node(pod("manual", 1)))
        answer = _devices(behind, old.gpus[0].uuid)
        assert answer.status_code == 400, answer.text
        assert old.gpus[0].uuid in answer.json()["error"]["message"]
        assert _held(behind) == set()


@pytest.mark.parametrize("cordon", [False, True], ids=["uncordoned", "cordoned"])
def test_a_gpu_the_node_has_now_is_held_through_a_replica_behind(
    settings: Settings, clock: FakeClock, cordon: bool
) -> None:
    kube = FakeKubeApi()
    with _reported_again(settings, clock, kube, cordon) as (first, behind, _old, new):
        kube.add(_on_node(pod("manual", 1)))
        answer = _devices(behind, new.gpus[0].uuid)
        assert answer.status_code == 200, answer.text
        assert [o["action"] for o in answer.json()["outcomes"]] == ["created"]
        assert _held(behind) == {new.gpus[0].uuid}
        if cordon:
            assert first.post(f"/v1/nodes/{NODE}/uncordon").status_code == 200
        # GPU 0 is the pod's: the first replica finds one GPU of eight taken.
        rest = first.post("/v1/place", json={"gpus": 8, "nodes": [NODE]})
        assert rest.status_code == 409, rest.text
