"""A pod that copies a gang member's annotations does not move that member's task.

The device report moves a gang member's task by the allocation and task its
pod's annotations name (the bind wrote them). Annotations are the pod
owner's to write: whoever may create a pod on the node (``nodeName`` set by
hand) can name any gang's allocation. Taken at its word, such a pod of
another namespace moved another tenant's task onto the GPUs its own pod got,
and left the GPUs that member runs on looking free, to be placed again.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import pod
from placement.profiles import build_profile
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi
from tests.service.k8s.running_pods import bound_and_started

NODE = "h100-a"
GANG = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(k8s_client, ("hgx-h100", NODE))
    return k8s_client


def _member(client: TestClient, kube: FakeKubeApi, name: str) -> dict[str, Any]:
    return bound_and_started(client, kube, NODE, name, 2, **GANG)


def _devices(p: dict[str, Any]) -> list[str]:
    return str(p["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _copy(kube: FakeKubeApi, of: dict[str, Any], namespace: str) -> None:
    """A pod of ``namespace`` put on the member's node by hand, under its annotations."""
    notes = {**of["metadata"]["annotations"], "topoplace.io/gpus": ""}
    copy = pod("copy", 2, annotations=notes, namespace=namespace)
    copy["spec"]["nodeName"] = NODE
    kube.add(copy)
    kube.start(namespace, "copy")


@pytest.mark.parametrize("namespace", ["other-team", "default"])
def test_a_pod_of_another_namespace_naming_a_gangs_task_does_not_move_it(
    fleet: TestClient, kube: FakeKubeApi, namespace: str
) -> None:
    first, second = _member(fleet, kube, "pair-0"), _member(fleet, kube, "pair-1")
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    before = fleet.get(f"/v1/allocations/{gang_id}").json()["tasks"]
    free = fleet.get(f"/v1/nodes/{NODE}").json()["free_gpus"]
    assert len(free) == 4
    _copy(kube, first, namespace)
    taken = sorted(set(_devices(first)) | set(_devices(second)))
    uuids = [g.uuid for g in build_profile("hgx-h100", NODE).gpus if g.uuid not in taken][:2]
    pods = [
        {"namespace": "ml-team", "name": "pair-0", "devices": _devices(first)},
        {"namespace": "ml-team", "name": "pair-1", "devices": _devices(second)},
        {"namespace": namespace, "name": "copy", "devices": uuids},
    ]
    answer = fleet.post(
        f"/v1/nodes/{NODE}/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": pods}
    )
    assert answer.status_code == 200, answer.text
    outcomes = {o["name"]: o for o in answer.json()["outcomes"]}
    assert outcomes["copy"]["action"] == "unmatched", outcomes["copy"]
    assert "own gang" in outcomes["copy"]["message"], outcomes["copy"]
    assert fleet.get(f"/v1/allocations/{gang_id}").json()["tasks"] == before
    # The member's GPUs stay held: none of them can be placed again.
    still_free = set(fleet.get(f"/v1/nodes/{NODE}").json()["free_gpus"])
    assert not still_free & {i for t in before for i in t["gpu_indices"]}


def _released(client: TestClient) -> str:
    placed = client.post("/v1/place", json={"gpus": 1, "job_id": "gone"})
    assert placed.status_code == 201, placed.text
    allocation_id = str(placed.json()["id"])
    assert client.post(f"/v1/allocations/{allocation_id}/release", json={}).status_code == 200
    return allocation_id


def test_a_pod_naming_an_allocation_learns_nothing_of_whether_it_exists(
    fleet: TestClient, kube: FakeKubeApi
) -> None:
    """The refusal is one for an id no allocation has, an ended allocation and another
    gang's live one: told apart, the node's agent could probe which ids are live."""
    first = _member(fleet, kube, "pair-0")
    named = {
        "another gang's": str(first["metadata"]["annotations"]["topoplace.io/allocation"]),
        "no such": "00000000-0000-4000-8000-000000000000",
        "ended": _released(fleet),
    }
    free = [g.uuid for g in build_profile("hgx-h100", NODE).gpus if g.uuid not in _devices(first)]
    answers: dict[str, dict[str, Any]] = {}
    for kind, allocation_id in named.items():
        notes = {**first["metadata"]["annotations"], "topoplace.io/allocation": allocation_id}
        _copy(kube, {"metadata": {"annotations": notes}}, "other-team")
        pods = [{"namespace": "other-team", "name": "copy", "devices": free[:2]}]
        answer = fleet.post(
            f"/v1/nodes/{NODE}/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": pods}
        )
        assert answer.status_code == 200, answer.text
        [outcome] = answer.json()["outcomes"]
        assert outcome.pop("allocation_id") == allocation_id  # the pod's own annotation
        answers[kind] = outcome
    assert answers["no such"]["action"] == "unmatched", answers
    assert answers["another gang's"] == answers["no such"] == answers["ended"], answers
