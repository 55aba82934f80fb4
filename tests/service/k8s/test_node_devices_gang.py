"""A report naming gang members and single pods is taken in one transaction, as a whole.

A gang member's truth moves one task of its gang's allocation; a single pod's
moves the pod's own. Both kinds are taken together: members and pods that the
kubelet admitted the other way round each keep their allocation, and a report
that fails part way leaves nothing of it behind; and two nodes' reports moving two
members of one gang at once both keep their move.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from placement.profiles import build_profile
from service.allocations import repository
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import held, replica
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi
from tests.service.k8s.running_pods import bound_and_started

NODE = "h100-a"
GANG = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(k8s_client, ("hgx-h100", NODE))
    return k8s_client


def _bound(
    client: TestClient, kube: FakeKubeApi, name: str, gpus: int, **notes: str
) -> dict[str, Any]:
    return bound_and_started(client, kube, NODE, name, gpus, **notes)


def _devices(p: dict[str, Any]) -> list[str]:
    return str(p["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _allocation(client: TestClient, allocation_id: str) -> dict[str, Any]:
    found: dict[str, Any] = client.get(f"/v1/allocations/{allocation_id}").json()
    return found


def _task_devices(allocation: dict[str, Any], task: int) -> list[str]:
    (found,) = [t for t in allocation["tasks"] if t["task"] == task]
    return sorted(found["gpu_uuids"])


def _report(client: TestClient, pods: dict[str, list[str]]) -> Any:
    body = [{"namespace": "ml-team", "name": n, "devices": d} for n, d in sorted(pods.items())]
    return client.post(
        f"/v1/nodes/{NODE}/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": body}
    )


def _scene(client: TestClient, kube: FakeKubeApi) -> tuple[dict[str, Any], ...]:
    """A gang of two 2-GPU members and a 2-GPU pod on one node: 6 GPUs held, 2 free."""
    first = _bound(client, kube, "pair-0", 2, **GANG)
    second = _bound(client, kube, "pair-1", 2, **GANG)
    solo = _bound(client, kube, "solo", 2)
    return first, second, solo


def test_a_member_and_a_pod_admitted_the_other_way_round_each_keep_their_allocation(
    fleet: TestClient, kube: FakeKubeApi
) -> None:
    first, second, solo = _scene(fleet, kube)
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    task = int(first["metadata"]["annotations"]["topoplace.io/gang-task"])
    solo_id = solo["metadata"]["annotations"]["topoplace.io/allocation"]
    body = _report(
        fleet, {"pair-0": _devices(solo), "pair-1": _devices(second), "solo": _devices(first)}
    )
    assert body.status_code == 200, body.text
    outcomes = {o["name"]: o for o in body.json()["outcomes"]}
    assert outcomes["pair-0"]["action"] == "moved", outcomes
    assert outcomes["solo"] == {
        "namespace": "ml-team",
        "name": "solo",
        "action": "moved",
        "allocation_id": solo_id,
        "message": "",
    }, "the pod keeps its own allocation: it is not the member's stale holder"
    assert _task_devices(_allocation(fleet, gang_id), task) == sorted(_devices(solo))
    now = _allocation(fleet, solo_id)
    assert now["state"] == "active"
    assert _task_devices(now, 0) == sorted(_devices(first))
    mismatches = fleet.get("/v1/k8s/mismatches").json()
    assert mismatches["counts"]["superseded"] == 0
    assert len(fleet.get(f"/v1/nodes/{NODE}").json()["free_gpus"]) == 2


def test_a_report_that_fails_part_way_leaves_nothing_of_it(
    fleet: TestClient, kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The member's move and the pod's are one change: the pod's failing (the database
    lost mid-transaction, here a fault injected into its relocation) undoes the member's
    too, and the report is simply taken again next round."""
    first, second, solo = _scene(fleet, kube)
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    task = int(first["metadata"]["annotations"]["topoplace.io/gang-task"])
    solo_id = solo["metadata"]["annotations"]["topoplace.io/allocation"]
    gang_before = _allocation(fleet, gang_id)
    free = [
        g.uuid
        for g in build_profile("hgx-h100", NODE).gpus
        if g.uuid not in {*_devices(first), *_devices(second), *_devices(solo)}
    ]
    relocate = repository.relocate

    def fails_for_the_pod(conn: Any, allocation_id: str, *args: Any, **kw: Any) -> Any:
        if allocation_id == solo_id:
            raise RuntimeError("the database connection was lost")
        return relocate(conn, allocation_id, *args, **kw)

    monkeypatch.setattr(repository, "relocate", fails_for_the_pod)
    devices = {"pair-0": free, "solo": _devices(first)}
    assert _report(fleet, devices).status_code == 500
    assert _allocation(fleet, gang_id)["tasks"] == gang_before["tasks"], "half applied"
    assert _task_devices(_allocation(fleet, solo_id), 0) == sorted(_devices(solo))
    monkeypatch.undo()
    body = _report(fleet, devices)
    assert body.status_code == 200, body.text
    assert _task_devices(_allocation(fleet, gang_id), task) == sorted(free)
    assert _task_devices(_allocation(fleet, solo_id), 0) == sorted(_devices(first))


NODES = ("h100-a", "h100-b")


def _member(client: TestClient, kube: FakeKubeApi, name: str) -> dict[str, Any]:
    """A 6-GPU member of a gang of two: the gang cannot fit one 8-GPU node, so each
    member is bound to the node the gang's plan gives it, and 2 GPUs stay free there."""
    p = kube.add(pod(name, 6, annotations=GANG))
    (node,) = client.post("/k8s/v1/filter", json=names_args(p, list(NODES))).json()["NodeNames"]
    assert client.post("/k8s/v1/bind", json=binding_args(p, node)).json() == {"Error": ""}
    kube.start("ml-team", name)
    return kube.get_pod("ml-team", name) or {}


def _moved_truth(member: dict[str, Any]) -> tuple[str, int, list[str]]:
    """The member's node, task, and the devices the kubelet gave it: two of those reserved
    swapped for the node's two free GPUs."""
    node = str(member["spec"]["nodeName"])
    task = int(member["metadata"]["annotations"]["topoplace.io/gang-task"])
    reserved = _devices(member)
    free = [g.uuid for g in build_profile("hgx-h100", node).gpus if g.uuid not in reserved]
    return node, task, sorted([*reserved[2:], *free])


def test_two_nodes_reports_moving_two_members_of_one_gang_at_once_keep_both_moves(
    k8s_client: TestClient,
    kube: FakeKubeApi,
    settings: Settings,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each node's device plugin reports its own member, to any replica, at any moment.
    A member's move rewrites the gang allocation's placement and holds from what its
    transaction read: the report committed in between (the other node's member moved) is
    not written over, or the gang would hold the GPUs that member left and free those it
    runs on, for the next pod to be bound onto."""
    add_nodes(k8s_client, *(("hgx-h100", n) for n in NODES))
    first, second = _member(k8s_client, kube, "pair-0"), _member(k8s_client, kube, "pair-1")
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    node_0, task_0, truth_0 = _moved_truth(first)
    node_1, task_1, truth_1 = _moved_truth(second)
    assert node_0 != node_1

    def post(client: TestClient, node: str, name: str, devices: list[str]) -> Any:
        body = {"namespace": "ml-team", "name": name, "devices": devices}
        return client.post(
            f"/v1/nodes/{node}/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": [body]}
        )

    with replica(settings, clock, kube) as other:
        holders = repository.holders
        answers: list[Any] = []

        def other_node_reports_meanwhile(conn: Any, devices: Any) -> Any:
            # pair-1's report has read the gang's row and holds; pair-0's, sent by its
            # own node to the other replica, commits before pair-1's is written.
            if not answers:
                answers.append(None)
                answers[0] = post(other, node_0, "pair-0", truth_0)
            return holders(conn, devices)

        monkeypatch.setattr(repository, "holders", other_node_reports_meanwhile)
        late = post(k8s_client, node_1, "pair-1", truth_1)
        monkeypatch.undo()
    (early,) = answers
    for answer in (early, late):
        assert answer.status_code == 200, answer.text
        assert answer.json()["outcomes"][0]["action"] == "moved", answer.text
    gang = _allocation(k8s_client, gang_id)
    assert _task_devices(gang, task_0) == truth_0, "pair-0's move was written over"
    assert _task_devices(gang, task_1) == truth_1
    assert held(k8s_client) == {(node_0, d) for d in truth_0} | {(node_1, d) for d in truth_1}
    # The GPUs pair-0 left are the free ones on its node, none of those it runs on.
    nxt = kube.add(pod("next", 2))
    assert k8s_client.post("/k8s/v1/bind", json=binding_args(nxt, node_0)).json() == {"Error": ""}
    given = kube.get_pod("ml-team", "next") or {}
    assert not set(_devices(given)) & set(truth_0), "two pods on one GPU"


def test_a_member_given_gpus_of_a_two_node_allocation_ends_none_of_it(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    """A gang member's move onto GPUs that another job's allocation holds on this node and
    on another: the node's report ended that allocation whole, and its GPUs on the other
    node were free under its running task. It is unmatched instead; nothing moves."""
    add_nodes(k8s_client, ("hgx-h100", NODE), ("hgx-h100", "h100-b"))
    first, _ = (
        _bound(k8s_client, kube, "pair-0", 2, **GANG),
        _bound(k8s_client, kube, "pair-1", 2, **GANG),
    )
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    gang_before = _allocation(k8s_client, gang_id)
    filler = {"gpus": 4, "job_id": "filler", "nodes": ["h100-b"]}
    assert k8s_client.post("/v1/place", json=filler).status_code == 201  # 4 left on each node
    wide = k8s_client.post(
        "/v1/place", json={"gpus": 4, "tasks": 2, "job_id": "wide", "nodes": [NODE, "h100-b"]}
    ).json()
    assert sorted(t["node"] for t in wide["tasks"]) == [NODE, "h100-b"], wide
    here = next(t for t in wide["tasks"] if t["node"] == NODE)["gpu_uuids"]

    body = _report(k8s_client, {"pair-0": sorted(here[:2])})

    assert body.status_code == 200, body.text
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "unmatched", outcome
    assert "another node" in outcome["message"]
    after = _allocation(k8s_client, wide["id"])
    assert after["state"] == wide["state"] and after["tasks"] == wide["tasks"]
    assert _allocation(k8s_client, gang_id)["tasks"] == gang_before["tasks"]
