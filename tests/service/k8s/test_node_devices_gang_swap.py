"""Two members of one gang on one node, admitted onto each other's GPUs or moved in one report."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from placement.profiles import build_profile
from tests.service.deaf_replicas import held
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi
from tests.service.k8s.running_pods import bound_and_started

NODE = "h100-a"
GANG = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}


def _devices(p: dict[str, Any]) -> list[str]:
    return str(p["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _task_devices(client: TestClient, gang_id: str, task: int) -> list[str]:
    allocation = client.get(f"/v1/allocations/{gang_id}").json()
    (found,) = [t for t in allocation["tasks"] if t["task"] == task]
    return sorted(found["gpu_uuids"])


def _report(client: TestClient, pods: dict[str, list[str]]) -> dict[str, Any]:
    body = [{"namespace": "ml-team", "name": n, "devices": d} for n, d in sorted(pods.items())]
    answer = client.post(
        f"/v1/nodes/{NODE}/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": body}
    )
    assert answer.status_code == 200, answer.text
    return {o["name"]: o for o in answer.json()["outcomes"]}


def _scene(client: TestClient, kube: FakeKubeApi) -> tuple[dict[str, Any], dict[str, Any]]:
    add_nodes(client, ("hgx-h100", NODE))
    first = bound_and_started(client, kube, NODE, "pair-0", 2, **GANG)
    second = bound_and_started(client, kube, NODE, "pair-1", 2, **GANG)
    return first, second


def _task(p: dict[str, Any]) -> int:
    return int(p["metadata"]["annotations"]["topoplace.io/gang-task"])


def test_a_member_on_the_gpus_its_gangs_other_task_leaves_in_the_same_report_is_moved(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    """pair-0 was given pair-1's task's GPUs, and pair-1 two free ones. In one report
    pair-1's task moves off those GPUs, so pair-0's task takes them. Before, pair-0's
    move was refused (another task of the gang held them, as read before the report's
    writes) while pair-1's was taken: the GPUs pair-0 runs on were held by nobody."""
    first, second = _scene(k8s_client, kube)
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    reserved = {*_devices(first), *_devices(second)}
    free = sorted(g.uuid for g in build_profile("hgx-h100", NODE).gpus if g.uuid not in reserved)
    outcomes = _report(k8s_client, {"pair-0": _devices(second), "pair-1": free[:2]})
    assert outcomes["pair-0"]["action"] == "moved", outcomes
    assert outcomes["pair-1"]["action"] == "moved", outcomes
    assert _task_devices(k8s_client, gang_id, _task(first)) == sorted(_devices(second))
    assert _task_devices(k8s_client, gang_id, _task(second)) == free[:2]
    assert held(k8s_client) == {(NODE, d) for d in [*_devices(second), *free[:2]]}


def test_two_members_admitted_onto_each_others_gpus_each_move(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    """pair-0 on pair-1's task's GPUs and pair-1 on pair-0's: each task moves onto what its
    member runs on (before: both unmatched, each task recorded on the other's GPUs)."""
    first, second = _scene(k8s_client, kube)
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    outcomes = _report(k8s_client, {"pair-0": _devices(second), "pair-1": _devices(first)})
    assert [outcomes[n]["action"] for n in ("pair-0", "pair-1")] == ["moved", "moved"], outcomes
    assert _task_devices(k8s_client, gang_id, _task(first)) == sorted(_devices(second))
    assert _task_devices(k8s_client, gang_id, _task(second)) == sorted(_devices(first))
    assert held(k8s_client) == {(NODE, d) for d in [*_devices(first), *_devices(second)]}
