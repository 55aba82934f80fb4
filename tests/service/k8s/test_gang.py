"""No member of a gang binds until the whole gang has a placement, reserved as one."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi
from tests.service.loop_watch import LoopWatch

NODES = ["h100-a", "h100-b", "l40s-c"]
RING = {
    "topoplace.io/gang": "ring",
    "topoplace.io/gang-size": "2",
    "topoplace.io/locality": "nvlink",
}


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(
        k8s_client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"), ("pcie-8x-l40s", "l40s-c")
    )
    return k8s_client


def _filter(client: TestClient, p: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = client.post("/k8s/v1/filter", json=names_args(p, NODES)).json()
    return result


def _bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    args = binding_args(p, node)
    error: str = client.post("/k8s/v1/bind", json=args).json()["Error"]
    return error


def test_members_bind_into_one_reservation_of_the_whole_gang(fleet: TestClient, kube: FakeKubeApi):
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))

    planned = _filter(fleet, first)
    # The plan puts the gang on both H100 nodes; this member gets exactly one task of it.
    assert planned["NodeNames"] == ["h100-a"]
    assert "placement puts this member on h100-a" in planned["FailedNodes"]["l40s-c"]
    assert _bind(fleet, first, "h100-a") == ""

    (gang,) = fleet.get("/v1/allocations", params={"job_id": "k8s-gang:ml-team/ring"}).json()[
        "allocations"
    ]
    assert gang["state"] == "active"
    assert sorted(t["node"] for t in gang["tasks"]) == ["h100-a", "h100-b"]
    # Both tasks are held from the first bind on: nothing else can take the second node.
    assert fleet.get("/v1/nodes/h100-b").json()["free_gpus"] == []

    left = _filter(fleet, second)
    assert left["NodeNames"] == ["h100-b"]
    assert "h100-b" in _bind(fleet, second, "h100-a")  # no task left there; says where
    assert _bind(fleet, second, "h100-b") == ""

    tasks = {b["metadata"]["name"]: b["metadata"]["annotations"] for b in kube.bindings}
    assert {n["topoplace.io/allocation"] for n in tasks.values()} == {gang["id"]}
    assert sorted(n["topoplace.io/gang-task"] for n in tasks.values()) == ["0", "1"]
    by_task = {str(t["task"]): t for t in gang["tasks"]}
    for notes in tasks.values():
        assert notes["topoplace.io/gpus"] == ",".join(
            by_task[notes["topoplace.io/gang-task"]]["gpu_uuids"]
        )


def test_claims_are_rebuilt_from_the_members_annotations(fleet: TestClient, kube: FakeKubeApi):
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))
    assert _bind(fleet, first, "h100-a") == ""
    fleet.app.state.k8s.gangs.forget("k8s-gang:ml-team/ring")  # type: ignore[attr-defined]
    # As after a restart: the reservation comes from the database, the claim from ring-0's pod.
    assert _filter(fleet, second)["NodeNames"] == ["h100-b"]
    assert _bind(fleet, second, "h100-b") == ""


def test_a_gang_that_does_not_fit_binds_no_member(fleet: TestClient, kube: FakeKubeApi):
    huge = {**RING, "topoplace.io/gang": "huge", "topoplace.io/gang-size": "3"}
    member = kube.add(pod("huge-0", 8, annotations=huge))
    result = _filter(fleet, member)
    assert result["NodeNames"] == []
    # Only the two H100 nodes have 8 NVLink-connected GPUs: the gang never fits, so
    # preempting pods cannot help (FailedAndUnresolvableNodes, not FailedNodes).
    assert not result["FailedNodes"]
    assert set(result["FailedAndUnresolvableNodes"]) == set(NODES)
    message = result["FailedAndUnresolvableNodes"]["h100-a"]
    assert "gang huge (3 pods) does not fit" in message
    assert "hold at most 2 tasks of 8 GPUs (connected by NVLink) even when idle" in message
    assert "cannot be reserved" in _bind(fleet, member, "h100-a")
    assert kube.bindings == []
    assert fleet.get("/v1/nodes/h100-a").json()["free_gpus"] == list(range(8))


def test_a_gangs_first_sight_reads_the_database_and_its_pods_off_the_event_loop(
    fleet: TestClient, kube: FakeKubeApi
) -> None:
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))
    assert _bind(fleet, first, "h100-a") == ""
    extender = fleet.app.state.k8s  # type: ignore[attr-defined]
    watch = LoopWatch()
    watch.calls(kube, "list_pods", "get_pod")
    with watch.database(fleet.app.state.service.engine):  # type: ignore[attr-defined]
        # As after a restart, filter first and prioritize first: both read the gang.
        extender.gangs.forget("k8s-gang:ml-team/ring")
        assert _filter(fleet, second)["NodeNames"] == ["h100-b"]
        extender.gangs.forget("k8s-gang:ml-team/ring")
        scores = fleet.post("/k8s/v1/prioritize", json=names_args(second, NODES)).json()
    assert {s["Host"]: s["Score"] for s in scores}["h100-b"] > 0
    # The reads happened, each on a worker thread.
    assert watch.seen["FakeKubeApi.list_pods"] == 2 and watch.seen["a database connection"] >= 2
    watch.check()


def _member(client: TestClient, kube: FakeKubeApi, name: str) -> tuple[str, list[str]]:
    """Bind a two-GPU member of a two-member gang: its node and its GPUs."""
    notes = {**RING, "topoplace.io/locality": "any"}
    p = kube.add(pod(name, 2, annotations=notes))
    (node, *_) = _filter(client, p)["NodeNames"]
    assert _bind(client, p, node) == ""
    kube.start("ml-team", name)  # its kubelet admitted it: device reports name its GPUs
    bound = kube.get_pod("ml-team", name) or {}
    return node, str(bound["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _gang(client: TestClient) -> dict[str, Any]:
    (gang,) = client.get("/v1/allocations", params={"job_id": "k8s-gang:ml-team/ring"}).json()[
        "allocations"
    ]
    return gang  # type: ignore[no-any-return]


def _report(client: TestClient, node: str, name: str, devices: list[str]) -> dict[str, Any]:
    body = {
        "resource": "nvidia.com/gpu",
        "pods": [{"namespace": "ml-team", "name": name, "devices": devices}],
    }
    answer = client.post(f"/v1/nodes/{node}/k8s/devices", json=body)
    assert answer.status_code == 200, answer.text
    (outcome,) = answer.json()["outcomes"]
    return outcome  # type: ignore[no-any-return]


def test_a_member_given_other_gpus_moves_its_task_alone(fleet: TestClient, kube: FakeKubeApi):
    node, was = _member(fleet, kube, "ring-0")
    before = _gang(fleet)
    held = {d for t in before["tasks"] if t["node"] == node for d in t["gpu_uuids"]}
    free = [
        g["uuid"] for g in fleet.get(f"/v1/nodes/{node}").json()["gpus"] if g["uuid"] not in held
    ]
    other = free[:2]
    outcome = _report(fleet, node, "ring-0", other)
    assert (outcome["action"], outcome["allocation_id"]) == ("moved", before["id"])
    after = _gang(fleet)
    moved = [t for t in after["tasks"] if t["node"] == node and set(t["gpu_uuids"]) == set(other)]
    assert len(moved) == 1
    untouched = [t for t in before["tasks"] if set(t["gpu_uuids"]) != set(was)]
    for task in untouched:  # the other member's task keeps its GPUs
        assert any(
            t["gpu_uuids"] == task["gpu_uuids"] and t["node"] == task["node"]
            for t in after["tasks"]
        )
    # The GPUs the member's container holds are not free; those it left are.
    free_now = set(fleet.get(f"/v1/nodes/{node}").json()["free_gpus"])
    gpus = {g["uuid"]: g["index"] for g in fleet.get(f"/v1/nodes/{node}").json()["gpus"]}
    assert not {gpus[u] for u in other} & free_now
    assert {gpus[u] for u in was} <= free_now
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 1
    # Reported again every round: nothing more changes, nothing more is counted.
    assert _report(fleet, node, "ring-0", other)["action"] == "matched"
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 1


def test_a_member_given_its_gangmates_gpus_is_counted_not_held_twice(
    fleet: TestClient, kube: FakeKubeApi
):
    node, was = _member(fleet, kube, "ring-0")
    gang = _gang(fleet)
    mates = [t for t in gang["tasks"] if set(t["gpu_uuids"]) != set(was)]
    (mate,) = mates
    if mate["node"] != node:
        pytest.skip("the plan put the two members on different nodes")
    outcome = _report(fleet, node, "ring-0", mate["gpu_uuids"])
    assert outcome["action"] == "unmatched"
    assert "another task" in outcome["message"]
    assert _gang(fleet)["tasks"] == gang["tasks"]  # nothing half-written
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["unmatched"] == 1


def test_a_member_reported_from_another_node_moves_nothing(fleet: TestClient, kube: FakeKubeApi):
    node, _ = _member(fleet, kube, "ring-0")
    before = _gang(fleet)
    other = next(n for n in ("h100-a", "h100-b") if n != node)
    held = {d for t in before["tasks"] if t["node"] == other for d in t["gpu_uuids"]}
    free = [
        g["uuid"] for g in fleet.get(f"/v1/nodes/{other}").json()["gpus"] if g["uuid"] not in held
    ]
    outcome = _report(fleet, other, "ring-0", free[:2])
    assert outcome["action"] == "deferred", outcome
    # The node the member runs on is not the reporting node's to learn.
    assert f"no pod of this name is bound to {other}" in outcome["message"]
    assert node not in outcome["message"]
    assert _gang(fleet)["tasks"] == before["tasks"]
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 0


@pytest.mark.parametrize("task", ["\u00b2", "9" * 5000, "-1"])
def test_a_task_number_no_gang_has_moves_nothing_and_faults_no_report(
    fleet: TestClient, kube: FakeKubeApi, task: str
) -> None:
    """A member's annotations are the pod owner's to write: a task number that is not a
    plain one (a superscript digit, past what int() reads) is no task, said per pod,
    and the node's report of its other pods goes through."""
    node, _ = _member(fleet, kube, "ring-0")
    before = _gang(fleet)
    kube.pods[("ml-team", "ring-0")]["metadata"]["annotations"]["topoplace.io/gang-task"] = task
    held = {d for t in before["tasks"] for d in t["gpu_uuids"]}
    free = [
        g["uuid"] for g in fleet.get(f"/v1/nodes/{node}").json()["gpus"] if g["uuid"] not in held
    ]
    outcome = _report(fleet, node, "ring-0", free[:2])
    assert outcome["action"] == "deferred", outcome
    assert _gang(fleet)["tasks"] == before["tasks"]


@pytest.mark.parametrize("task", ["\u00b9", "7", "1"])
def test_claims_are_rebuilt_only_from_members_bound_to_their_task(
    fleet: TestClient, kube: FakeKubeApi, task: str
) -> None:
    """Anyone who may create pods in the namespace may copy a member's annotations: a pod
    that is not bound where its task is claims nothing, and no task number (a superscript
    digit, one past the gang) makes the gang's first sight after a restart a fault."""
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))
    assert _bind(fleet, first, "h100-a") == ""
    (gang,) = fleet.get("/v1/allocations", params={"job_id": "k8s-gang:ml-team/ring"}).json()[
        "allocations"
    ]
    notes = {**RING, "topoplace.io/allocation": gang["id"], "topoplace.io/gang-task": task}
    copied = kube.add(pod("ring-copy", 8, annotations=notes))
    fleet.app.state.k8s.gangs.forget("k8s-gang:ml-team/ring")  # type: ignore[attr-defined]
    # As after a restart: the copy's annotations are read with ring-0's.
    assert _filter(fleet, second)["NodeNames"] == ["h100-b"]
    assert _bind(fleet, second, "h100-b") == ""
    # The copy is a third member of a gang of two: told so, not a fault.
    answer = fleet.post("/k8s/v1/filter", json=names_args(copied, NODES))
    assert answer.status_code == 200, answer.text
    assert answer.json()["NodeNames"] == []


def test_a_bound_members_bind_to_another_node_keeps_its_task(
    fleet: TestClient, kube: FakeKubeApi
) -> None:
    """A member already bound (its first bind's answer lost, a second scheduler's bind in
    flight) bound again to another node: the pod runs on its task's GPUs, so its claim
    stays and no later pod of the gang is given that task; no Binding names one node's
    GPUs for another."""
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))
    assert _bind(fleet, first, "h100-a") == ""
    error = _bind(fleet, first, "h100-b")
    assert error.startswith("topoplace: ") and "holds its task on h100-a" in error
    assert len(kube.bindings) == 1
    assert _bind(fleet, second, "h100-b") == ""
    # A pod of the gang made later (a member replaced by its controller while ring-0
    # runs) finds no task: both are held by running members.
    extra = kube.add(pod("ring-2", 8, annotations=RING))
    assert _filter(fleet, extra)["NodeNames"] == []
    assert "no free task" in _bind(fleet, extra, "h100-a")
    assert len(kube.bindings) == 2
