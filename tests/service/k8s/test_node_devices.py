"""The device plugin's two calls: a node's pod reservations, and the kubelet's truth winning."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from placement.profiles import build_profile
from service.k8s import node_devices
from service.k8s.kube_api import KubeApiError
from service.log_gate import LOG_EVERY_S, LogGate
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODE = "h100-a"


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(k8s_client, ("hgx-h100", NODE), ("dgx-a100-mig", "mig-b"))
    return k8s_client


def _bound(
    client: TestClient, kube: FakeKubeApi, name: str, gpus: int, started: bool = True
) -> dict[str, Any]:
    """A pod filtered and bound to NODE; ``started``: and its kubelet started it."""
    p = kube.add(pod(name, gpus))
    assert client.post("/k8s/v1/filter", json=names_args(p, [NODE])).json()["NodeNames"] == [NODE]
    assert client.post("/k8s/v1/bind", json=binding_args(p, NODE)).json() == {"Error": ""}
    if started:
        kube.start("ml-team", name)
    return kube.get_pod("ml-team", name) or {}


def _uuids() -> list[str]:
    return [g.uuid for g in build_profile("hgx-h100", NODE).gpus]


def _reservations(client: TestClient) -> list[dict[str, Any]]:
    response = client.get(f"/v1/nodes/{NODE}/k8s/reservations")
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["reservations"]
    return found


def _report(
    client: TestClient, pods: list[dict[str, Any]], listed_at: datetime | None = None
) -> Any:
    body: dict[str, Any] = {"resource": "nvidia.com/gpu", "pods": pods}
    if listed_at is not None:
        body["listed_at"] = listed_at.isoformat()
    return client.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)


def test_reservations_are_the_bound_pods_oldest_first_with_their_annotated_gpus(
    fleet: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    first = _bound(fleet, kube, "first", 2)
    clock.advance(1)
    second = _bound(fleet, kube, "second", 4)
    found = _reservations(fleet)
    assert [(r["namespace"], r["pod"]) for r in found] == [
        ("ml-team", "first"),
        ("ml-team", "second"),
    ]
    for reservation, p in zip(found, (first, second), strict=True):
        notes = p["metadata"]["annotations"]
        assert reservation["devices"] == notes["topoplace.io/gpus"].split(",")
        assert reservation["allocation_id"] == notes["topoplace.io/allocation"]
        assert reservation["pod_uid"] == p["metadata"]["uid"]
        assert reservation["resource"] == "nvidia.com/gpu"
        assert reservation["nvlink_connected"] is True  # NVSwitch: every pair on NVLink
        assert reservation["state"] == "active"


def test_a_matching_report_changes_nothing(fleet: TestClient, kube: FakeKubeApi):
    _bound(fleet, kube, "first", 2)
    (reservation,) = _reservations(fleet)
    before = fleet.get("/v1/k8s/mismatches").json()["counts"]
    body = _report(
        fleet, [{"namespace": "ml-team", "name": "first", "devices": reservation["devices"][::-1]}]
    )
    assert body.status_code == 200, body.text
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "matched"
    assert outcome["allocation_id"] == reservation["allocation_id"]
    assert fleet.get("/v1/k8s/mismatches").json()["counts"] == before


def test_the_kubelets_choice_moves_the_allocation(fleet: TestClient, kube: FakeKubeApi):
    _bound(fleet, kube, "first", 2)
    (reservation,) = _reservations(fleet)
    uuids = _uuids()
    other = [u for u in uuids if u not in reservation["devices"]][:2]
    before = fleet.get("/v1/k8s/mismatches").json()["counts"]["moved"]
    body = _report(fleet, [{"namespace": "ml-team", "name": "first", "devices": other}]).json()
    (outcome,) = body["outcomes"]
    assert outcome == {
        "namespace": "ml-team",
        "name": "first",
        "action": "moved",
        "allocation_id": reservation["allocation_id"],
        "message": "",
    }
    (now,) = _reservations(fleet)
    assert sorted(now["devices"]) == sorted(other)
    mismatches = fleet.get("/v1/k8s/mismatches").json()
    assert mismatches["counts"]["moved"] == before + 1
    assert mismatches["recent"][-1]["reserved"] == reservation["devices"]
    # The GPUs given up are free again: nothing is held twice.
    allocation = fleet.get(f"/v1/allocations/{reservation['allocation_id']}").json()
    assert sorted(d for t in allocation["tasks"] for d in t["gpu_uuids"]) == sorted(other)


def test_a_pod_without_a_reservation_gets_one(fleet: TestClient, kube: FakeKubeApi):
    manual = kube.add(_on_node(pod("manual", 1), NODE))
    uuids = _uuids()
    body = _report(
        fleet, [{"namespace": "ml-team", "name": "manual", "devices": uuids[-1:]}]
    ).json()
    (outcome,) = body["outcomes"]
    assert outcome["action"] == "created"
    allocation = fleet.get(f"/v1/allocations/{outcome['allocation_id']}").json()
    assert allocation["job_id"] == manual["metadata"]["uid"]
    assert allocation["owner"] == "k8s-pod:ml-team/manual"
    assert allocation["state"] == "active"


def test_a_pod_bound_to_another_node_is_not_moved_onto_this_one(
    fleet: TestClient, kube: FakeKubeApi
):
    # A report names pods by namespace and name only; the one of that name in the API runs
    # elsewhere (a StatefulSet's pod recreated on another node, or another node's pod named
    # by this node's token). Its allocation there keeps its GPUs.
    add_nodes(fleet, ("hgx-h100", "h100-c"))
    p = kube.add(pod("elsewhere", 2))
    assert fleet.post("/k8s/v1/bind", json=binding_args(p, "h100-c")).json() == {"Error": ""}
    (before,) = fleet.get("/v1/allocations", params={"node": "h100-c"}).json()["allocations"]
    body = _report(fleet, [{"namespace": "ml-team", "name": "elsewhere", "devices": _uuids()[:2]}])
    assert body.status_code == 200, body.text
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "deferred", outcome
    # Where the pod runs is another node's fact: the message names only this node.
    assert "no pod of this name is bound to h100-a" in outcome["message"]
    assert "h100-c" not in body.text
    after = fleet.get(f"/v1/allocations/{before['id']}").json()
    assert (after["state"], after["tasks"]) == (before["state"], before["tasks"])
    assert fleet.get(f"/v1/nodes/{NODE}").json()["free_gpus"] == list(range(8))
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["moved"] == 0


def test_an_unbound_pod_is_deferred(fleet: TestClient, kube: FakeKubeApi):
    kube.add(pod("unbound", 1))
    body = _report(fleet, [{"namespace": "ml-team", "name": "unbound", "devices": _uuids()[:1]}])
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "deferred", outcome
    assert "no pod of this name is bound to h100-a" in outcome["message"]
    assert fleet.get("/v1/allocations", params={"node": NODE}).json()["allocations"] == []


def test_a_report_answers_this_nodes_mismatch_counts_not_the_clusters(
    fleet: TestClient, kube: FakeKubeApi
):
    """The totals (GET /v1/k8s/mismatches) are every node's: a node's agent learns its own."""
    add_nodes(fleet, ("hgx-h100", "h100-c"))
    elsewhere = kube.add(_on_node(pod("elsewhere", 1), "h100-c"))
    uuids = [g.uuid for g in build_profile("hgx-h100", "h100-c").gpus]
    report = {"resource": "nvidia.com/gpu", "pods": [_named(elsewhere, uuids[-1:])]}
    other = fleet.post("/v1/nodes/h100-c/k8s/devices", json=report)
    assert other.json()["mismatches"]["created"] == 1, other.text
    body = _report(fleet, [])
    assert body.status_code == 200, body.text
    assert body.json()["mismatches"] == {"moved": 0, "created": 0, "unmatched": 0, "superseded": 0}
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["created"] == 1


def _named(p: dict[str, Any], devices: list[str]) -> dict[str, Any]:
    return {"namespace": "ml-team", "name": p["metadata"]["name"], "devices": devices}


def _on_node(p: dict[str, Any], node: str) -> dict[str, Any]:
    """``p`` as bound to ``node`` outside the extender (by hand, or by another scheduler)
    and started by its kubelet."""
    p["spec"]["nodeName"] = node
    p["status"]["startTime"] = "2026-11-29T10:21:09Z"
    return p


def test_a_pod_made_again_under_its_name_leaves_its_predecessors_reservation(
    fleet: TestClient, kube: FakeKubeApi
):
    old = _bound(fleet, kube, "trainer", 2)
    (reservation,) = _reservations(fleet)
    # A StatefulSet's pod deleted and made again: the same name, a new UID. Its
    # predecessor's release is still to come (the watch lags), and the new pod was
    # given two other GPUs.
    kube.delete("ml-team", "trainer")
    again = kube.add(_on_node(pod("trainer", 2), NODE))
    other = [u for u in _uuids() if u not in reservation["devices"]][:2]
    body = _report(fleet, [{"namespace": "ml-team", "name": "trainer", "devices": other}])
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "created", outcome
    created = fleet.get(f"/v1/allocations/{outcome['allocation_id']}").json()
    assert created["job_id"] == again["metadata"]["uid"]
    # The predecessor's reservation ends with its pod, and the new pod's GPUs stay held.
    released = fleet.post(f"/v1/jobs/{old['metadata']['uid']}/release")
    assert released.status_code == 200, released.text
    assert fleet.get(f"/v1/allocations/{reservation['allocation_id']}").json()["state"] == (
        "released"
    )
    now = fleet.get(f"/v1/allocations/{outcome['allocation_id']}").json()
    assert now["state"] == "active", "the new pod runs on these GPUs: they stay held"
    assert sorted(d for t in now["tasks"] for d in t["gpu_uuids"]) == sorted(other)


def test_a_report_of_a_pod_whose_name_is_now_bound_elsewhere_moves_nothing(
    fleet: TestClient, kube: FakeKubeApi
):
    add_nodes(fleet, ("hgx-h100", "h100-b"))
    _bound(fleet, kube, "trainer", 2)
    (reservation,) = _reservations(fleet)
    assert fleet.post(f"/v1/allocations/{reservation['allocation_id']}/release").status_code == 200
    kube.delete("ml-team", "trainer")
    # Made again under its name and bound to another node, where it holds its GPUs ...
    again = kube.add(pod("trainer", 2))
    assert fleet.post("/k8s/v1/bind", json=binding_args(again, "h100-b")).json() == {"Error": ""}
    (elsewhere,) = fleet.get("/v1/allocations", params={"job_id": again["metadata"]["uid"]}).json()[
        "allocations"
    ]
    # ... while this node's report still names the pod that ran here.
    body = _report(
        fleet, [{"namespace": "ml-team", "name": "trainer", "devices": reservation["devices"]}]
    )
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "deferred", outcome
    assert "no pod of this name is bound to h100-a" in outcome["message"]
    assert "h100-b" not in body.text
    kept = fleet.get(f"/v1/allocations/{elsewhere['id']}").json()
    assert [t["node"] for t in kept["tasks"]] == ["h100-b"], "its reservation stays where it runs"
    here = fleet.get("/v1/allocations", params={"node": NODE}).json()["allocations"]
    assert [a["id"] for a in here if a["state"] != "released"] == []


def test_an_unreadable_pod_is_deferred_not_guessed(fleet: TestClient, kube: FakeKubeApi):
    kube.add(pod("manual", 1))
    uuids = _uuids()
    kube.get_pod = _refuse  # type: ignore[method-assign]
    body = _report(fleet, [{"namespace": "ml-team", "name": "manual", "devices": uuids[:1]}]).json()
    (outcome,) = body["outcomes"]
    assert outcome["action"] == "deferred"
    assert "Kubernetes API" in outcome["message"]
    # The API's own words (its address, the service's account) go to the log only.
    assert "10.96.0.1" not in outcome["message"]
    assert fleet.get("/v1/allocations", params={"node": NODE}).json()["allocations"] == []


def _refuse(namespace: str, name: str) -> dict[str, Any] | None:
    raise KubeApiError(0, "https://10.96.0.1:443 did not answer: connection refused")


def test_unreadable_pods_are_logged_once_a_while_not_each_report(
    fleet: TestClient,
    kube: FakeKubeApi,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    """While the API cannot be read, every pod of every report (each 10 s per node) meets
    it: one line a while, saying how many were held back, not one per pod per report."""
    now = [1000.0]
    monkeypatch.setattr(node_devices, "_unreadable_logged", LogGate(clock=lambda: now[0]))
    uuids = _uuids()
    pods = [{"namespace": "ml-team", "name": f"p{i}", "devices": [uuids[i]]} for i in range(3)]
    for p in pods:
        kube.add(pod(str(p["name"]), 1))
    kube.get_pod = _refuse  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="topoplace.k8s")
    for _ in range(3):
        outcomes = _report(fleet, pods).json()["outcomes"]
        assert [o["action"] for o in outcomes] == ["deferred"] * 3
    lines = [r.getMessage() for r in caplog.records if "cannot read pod" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "10.96.0.1" in lines[0]  # the API's words are the operator's to read
    now[0] += LOG_EVERY_S
    _report(fleet, pods)
    lines = [r.getMessage() for r in caplog.records if "cannot read pod" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "(8 such reads failed unlogged since the last line)" in lines[1]


def test_an_unknown_device_is_refused_before_anything_changes(fleet: TestClient, kube: FakeKubeApi):
    _bound(fleet, kube, "first", 2)
    (reservation,) = _reservations(fleet)
    uuids = _uuids()
    other = [u for u in uuids if u not in reservation["devices"]][:2]
    response = _report(
        fleet,
        [
            {"namespace": "ml-team", "name": "first", "devices": other},
            {"namespace": "ml-team", "name": "x", "devices": ["GPU-not-here"]},
        ],
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "bad_request"
    assert "GPU-not-here" in error["message"]
    assert error["detail"]["field"] == "pods.1.devices"
    (now,) = _reservations(fleet)
    assert now["devices"] == reservation["devices"]  # the first pod was not moved either


def test_a_finished_pods_devices_in_a_report_take_nothing_from_the_pod_now_on_them(
    fleet: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    # The kubelet's List still names a Succeeded pod's devices (kubernetes#119423) after
    # it gave them to the next pod: the finished pod runs on nothing.
    done = _bound(fleet, kube, "done", 2)
    assert len(_reservations(fleet)) == 1
    kube.pods[("ml-team", "done")]["status"]["phase"] = "Succeeded"
    assert fleet.post(f"/v1/jobs/{done['metadata']['uid']}/release").status_code == 200
    clock.advance(1)
    _bound(fleet, kube, "next", 2)
    (running,) = _reservations(fleet)
    body = _report(
        fleet,
        [
            {"namespace": "ml-team", "name": "done", "devices": running["devices"]},
            {"namespace": "ml-team", "name": "next", "devices": running["devices"]},
        ],
    )
    assert body.status_code == 200, body.text
    done_outcome, next_outcome = body.json()["outcomes"]
    assert done_outcome["action"] == "deferred", done_outcome
    assert "Succeeded" in done_outcome["message"]
    assert next_outcome["action"] == "matched"
    assert _reservations(fleet) == [running], "the running pod keeps its GPUs, held once"


def _two_bound(client: TestClient, kube: FakeKubeApi, clock: FakeClock) -> list[dict[str, Any]]:
    _bound(client, kube, "first", 2)
    clock.advance(1)
    _bound(client, kube, "second", 2)
    found = _reservations(client)
    assert [r["pod"] for r in found] == ["first", "second"]
    return found


def test_a_device_named_twice_for_one_pod_is_refused_before_anything_changes(
    fleet: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    first, second = _two_bound(fleet, kube, clock)
    twice = [second["devices"][0], first["devices"][0], first["devices"][0]]
    response = _report(
        fleet,
        [
            {"namespace": "ml-team", "name": "first", "devices": first["devices"]},
            {"namespace": "ml-team", "name": "second", "devices": twice},
        ],
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_request"
    assert error["detail"] == {"field": "pods.1.devices", "device": first["devices"][0]}
    assert _reservations(fleet) == [first, second]  # nobody's allocation moved or ended


def test_a_device_two_running_pods_name_is_taken_from_neither(
    fleet: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    # The kubelet never gives one device to two running containers: not the truth, and
    # taken as such the second pod's move would release the first one's allocation.
    first, second = _two_bound(fleet, kube, clock)
    response = _report(
        fleet,
        [
            {"namespace": "ml-team", "name": "first", "devices": first["devices"]},
            {
                "namespace": "ml-team",
                "name": "second",
                "devices": [first["devices"][0], second["devices"][1]],
            },
        ],
    )
    assert response.status_code == 200, response.text
    one, two = response.json()["outcomes"]
    assert one["action"] == "matched"
    assert two["action"] == "unmatched", two
    assert first["devices"][0] in two["message"]
    assert _reservations(fleet) == [first, second]  # nobody's allocation moved or ended


@pytest.mark.parametrize(
    "body",
    [
        {"resource": "nvidia.com/gpu"},
        {"resource": "gpu", "pods": []},
        {"resource": "nvidia.com/gpu", "pods": [{"namespace": "a", "name": "b", "devices": []}]},
        {"resource": "nvidia.com/gpu", "pods": [], "extra": 1},
    ],
)
def test_malformed_reports_are_refused(fleet: TestClient, body: dict[str, Any]):
    response = fleet.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"


@pytest.mark.parametrize(
    ("namespace", "name", "field"),
    [
        # A line break would forge lines of the service's log, which names the pod.
        ("ml-team\n2026-01-01 CRITICAL forged", "first", "namespace"),
        ("ml-team", "first\x1b[2Jhidden", "name"),
        # A slash is kept by the API path's quoting: another object's path than the pod's.
        ("ml-team/pods/first/..", "first", "namespace"),
        ("ml-team", "Not_A_Pod", "name"),
    ],
)
def test_a_pod_name_kubernetes_cannot_have_is_refused(
    fleet: TestClient,
    kube: FakeKubeApi,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    namespace: str,
    name: str,
    field: str,
) -> None:
    """The report is the node's word; the names in it reach the service's log and the
    API server's path, so they are what Kubernetes allows or refused whole."""
    monkeypatch.setattr(node_devices, "_unreadable_logged", LogGate())
    kube.get_pod = _refuse  # type: ignore[method-assign]  # a failed read logs the names
    caplog.set_level(logging.WARNING, logger="topoplace.k8s")
    response = _report(fleet, [{"namespace": namespace, "name": name, "devices": _uuids()[:1]}])
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert f"pods.0.{field}" in response.text
    assert "forged" not in caplog.text and "hidden" not in caplog.text


@pytest.mark.parametrize(
    "device",
    ["GPU-" + "a" * 200, "GPU-a\n2026-01-01 CRITICAL forged", "GPU-a\u202ehidden", "GPU-a,GPU-b"],
)
def test_a_device_no_gpu_can_be_named_is_refused(fleet: TestClient, device: str) -> None:
    """A reported device is echoed in the detail of a refusal: it is bounded and
    spelled as a device UUID is (placement/snapshot.py), or refused with its field."""
    first = _uuids()[0]
    response = _report(
        fleet, [{"namespace": "ml-team", "name": "first", "devices": [first, device]}]
    )
    assert response.status_code == 422, response.text[:300]
    assert response.json()["error"]["code"] == "invalid_request"
    assert "pods.0.devices.1" in response.text
    assert "forged" not in response.text and "hidden" not in response.text


def test_an_unknown_node_is_a_404(fleet: TestClient):
    response = fleet.get("/v1/nodes/nowhere/k8s/reservations")
    assert response.status_code == 404
    assert "nowhere" in response.json()["error"]["message"]


MIG_NODE = "mig-b"


def _bound_mig(client: TestClient, kube: FakeKubeApi, name: str, resource: str) -> list[str]:
    p = kube.add(pod(name, 1, resource=resource))
    passed = client.post("/k8s/v1/filter", json=names_args(p, [MIG_NODE])).json()
    assert passed["NodeNames"] == [MIG_NODE], passed
    assert client.post("/k8s/v1/bind", json=binding_args(p, MIG_NODE)).json() == {"Error": ""}
    kube.start("ml-team", name)
    found = kube.get_pod("ml-team", name) or {}
    return str(found["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _mig_report(client: TestClient, resource: str, pods: list[dict[str, Any]]) -> Any:
    return client.post(
        f"/v1/nodes/{MIG_NODE}/k8s/devices", json={"resource": resource, "pods": pods}
    )


def _mig_holders(client: TestClient) -> list[str]:
    """Every live MIG instance hold on the MIG node, one entry per hold."""
    listed = client.get("/v1/allocations", params={"node": MIG_NODE}).json()["allocations"]
    return [
        m
        for a in listed
        if a["state"] in ("pending", "active", "degraded")
        for t in a["tasks"]
        for m in t["mig_uuids"]
    ]


def _profile() -> tuple[str, list[str]]:
    snap = build_profile("dgx-a100-mig", MIG_NODE)
    profile = sorted({m.profile for m in snap.mig_instances})[0]
    return f"nvidia.com/mig-{profile}", [m.uuid for m in snap.mig_instances if m.profile == profile]


def test_the_kubelets_other_mig_instance_moves_the_allocation(fleet: TestClient, kube: FakeKubeApi):
    resource, instances = _profile()
    reserved = _bound_mig(fleet, kube, "mig-pod", resource)
    other = [u for u in instances if u not in reserved][:1]
    before = fleet.get("/v1/k8s/mismatches").json()["counts"]["moved"]
    body = _mig_report(
        fleet, resource, [{"namespace": "ml-team", "name": "mig-pod", "devices": other}]
    ).json()
    (outcome,) = body["outcomes"]
    assert outcome["action"] == "moved", outcome
    allocation = fleet.get(f"/v1/allocations/{outcome['allocation_id']}").json()
    assert [m for t in allocation["tasks"] for m in t["mig_uuids"]] == other
    assert allocation["job_id"] == (kube.get_pod("ml-team", "mig-pod") or {})["metadata"]["uid"]
    counts = fleet.get("/v1/k8s/mismatches").json()["counts"]
    assert counts["moved"] == before + 1 and counts["unmatched"] == 0
    assert _mig_holders(fleet) == other  # the reserved instance is free again
    # The same truth again changes nothing.
    again = _mig_report(
        fleet, resource, [{"namespace": "ml-team", "name": "mig-pod", "devices": other}]
    ).json()
    assert again["outcomes"][0]["action"] == "matched"
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["moved"] == before + 1


def test_a_mig_instance_another_pod_reserved_is_held_once(fleet: TestClient, kube: FakeKubeApi):
    resource, _ = _profile()
    first = _bound_mig(fleet, kube, "first", resource)
    second = _bound_mig(fleet, kube, "second", resource)
    assert first != second
    # The kubelet gives "first" the instance the service reserved for "second".
    body = _mig_report(
        fleet, resource, [{"namespace": "ml-team", "name": "first", "devices": second}]
    ).json()
    (outcome,) = body["outcomes"]
    assert outcome["action"] == "moved"
    holders = _mig_holders(fleet)
    assert holders == second  # "second"'s stale reservation was released: one holder
    recent = fleet.get("/v1/k8s/mismatches").json()["recent"][-1]
    assert recent["superseded"] and recent["allocated"] == second


def test_a_mig_report_of_no_such_instance_is_refused(fleet: TestClient, kube: FakeKubeApi):
    resource, _ = _profile()
    reserved = _bound_mig(fleet, kube, "mig-pod", resource)
    answer = _mig_report(
        fleet, resource, [{"namespace": "ml-team", "name": "mig-pod", "devices": ["MIG-nope"]}]
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_request"
    assert _mig_holders(fleet) == reserved


def test_two_pods_admitted_the_other_way_round_keep_their_allocations(
    fleet: TestClient, kube: FakeKubeApi, clock: FakeClock
):
    # Two same-size pods bound within moments may be admitted in the other order: each
    # container then holds the other pod's reservation. One report says so for both; each
    # pod's own allocation moves onto what it holds, and neither is released as stale.
    _bound(fleet, kube, "first", 2)
    clock.advance(1)
    _bound(fleet, kube, "second", 2)
    first, second = _reservations(fleet)
    before = fleet.get("/v1/k8s/mismatches").json()["counts"]
    body = _report(
        fleet,
        [
            {"namespace": "ml-team", "name": "first", "devices": second["devices"]},
            {"namespace": "ml-team", "name": "second", "devices": first["devices"]},
        ],
    )
    assert body.status_code == 200, body.text
    outcomes = {o["name"]: o for o in body.json()["outcomes"]}
    assert outcomes["first"]["allocation_id"] == first["allocation_id"], outcomes
    assert outcomes["second"]["allocation_id"] == second["allocation_id"], outcomes
    assert [o["action"] for o in outcomes.values()] == ["moved", "moved"], outcomes
    now = {r["pod"]: r for r in _reservations(fleet)}
    assert now["first"]["allocation_id"] == first["allocation_id"]
    assert sorted(now["first"]["devices"]) == sorted(second["devices"])
    assert now["second"]["allocation_id"] == second["allocation_id"]
    assert sorted(now["second"]["devices"]) == sorted(first["devices"])
    counts = fleet.get("/v1/k8s/mismatches").json()["counts"]
    assert counts["superseded"] == before["superseded"], counts


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_the_kubelet_still_lists_takes_no_gpus_back(
    fleet: TestClient, kube: FakeKubeApi, phase: str
):
    # The kubelet's PodResources may still name a finished pod's devices; its reservation
    # ended with it and another pod's now holds them. Nothing is created for the finished
    # pod, and the other pod's reservation keeps its GPUs.
    _bound(fleet, kube, "done", 2)
    (finished,) = _reservations(fleet)
    kube.pods[("ml-team", "done")]["status"] = {"phase": phase}
    released = fleet.post(f"/v1/allocations/{finished['allocation_id']}/release")
    assert released.status_code == 200, released.text
    _bound(fleet, kube, "next", 2)
    (taken,) = _reservations(fleet)
    body = _report(fleet, [{"namespace": "ml-team", "name": "done", "devices": taken["devices"]}])
    assert body.status_code == 200, body.text
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "deferred", outcome
    assert phase in outcome["message"]
    (still,) = _reservations(fleet)
    assert (still["allocation_id"], still["devices"]) == (taken["allocation_id"], taken["devices"])
    assert fleet.get("/v1/k8s/mismatches").json()["counts"]["superseded"] == 0


def test_a_pod_reported_twice_is_refused_before_anything_changes(
    fleet: TestClient, kube: FakeKubeApi
):
    # The plugin lists a pod once: a report naming it twice is not a truth to follow
    # (its second entry would move what its first just moved), and nothing of it is
    # applied. A device named twice for one pod is refused the same way (above).
    _bound(fleet, kube, "first", 2)
    (reservation,) = _reservations(fleet)
    other = [u for u in _uuids() if u not in reservation["devices"]][:2]
    first = {"namespace": "ml-team", "name": "first", "devices": other}
    response = _report(fleet, [first, {**first, "devices": reservation["devices"]}])
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_request"
    assert error["detail"] == {"field": "pods.1"}, error
    assert _reservations(fleet) == [reservation]


def _made_again_over_the_earlier_ones_gpus(
    fleet: TestClient, kube: FakeKubeApi
) -> tuple[list[str], str, str]:
    """web-0 ran here, was deleted (its reservation released with it) and made again; a
    neighbour took GPUs meanwhile, and the new web-0 was bound here, not started yet.
    (the earlier web-0's devices, the new one's allocation, the neighbour's)."""
    earlier = _bound(fleet, kube, "web-0", 2)
    (reservation,) = _reservations(fleet)
    kube.delete("ml-team", "web-0")
    assert fleet.post(f"/v1/jobs/{earlier['metadata']['uid']}/release").status_code == 200
    neighbour = _bound(fleet, kube, "neighbour", 2)
    again = _bound(fleet, kube, "web-0", 2, started=False)
    mine = again["metadata"]["annotations"]["topoplace.io/allocation"]
    theirs = neighbour["metadata"]["annotations"]["topoplace.io/allocation"]
    return reservation["devices"], mine, theirs


def _unchanged(fleet: TestClient, *allocation_ids: str) -> dict[str, Any]:
    return {i: fleet.get(f"/v1/allocations/{i}").json() for i in allocation_ids}


def test_a_list_naming_a_pod_made_again_before_its_kubelet_started_it_moves_nothing(
    fleet: TestClient, kube: FakeKubeApi
):
    """The kubelet names pods, not UIDs: until it has started the new web-0, the devices
    its List shows under that name are the earlier web-0's (still in its list, or read
    before it went). Taken as the new pod's, they would move its reservation onto GPUs
    another pod may hold now, and leave the GPUs it will run on looking free."""
    devices, mine, theirs = _made_again_over_the_earlier_ones_gpus(fleet, kube)
    before = _unchanged(fleet, mine, theirs)
    body = _report(fleet, [{"namespace": "ml-team", "name": "web-0", "devices": devices}])
    assert body.status_code == 200, body.text
    (outcome,) = body.json()["outcomes"]
    assert outcome["action"] == "deferred", outcome
    assert "not started" in outcome["message"]
    assert _unchanged(fleet, mine, theirs) == before
    # Once the kubelet started it, its own devices in a List read since are its truth.
    kube.start("ml-team", "web-0")
    now = fleet.get(f"/v1/allocations/{mine}").json()
    body = _report(
        fleet, [{"namespace": "ml-team", "name": "web-0", "devices": now["tasks"][0]["gpu_uuids"]}]
    )
    assert body.json()["outcomes"][0]["action"] == "matched"


def test_a_list_read_before_the_pod_of_its_name_started_moves_nothing(
    fleet: TestClient, kube: FakeKubeApi
):
    """The plugin says when it read the List (``listed_at``, the node's clock, as the
    kubelet's ``startTime`` is): a List read before the kubelet started the pod now under
    that name, and answered after, shows an earlier pod's devices. Times are whole
    seconds in the API: a List within the second of the start is not taken either."""
    devices, mine, theirs = _made_again_over_the_earlier_ones_gpus(fleet, kube)
    started = datetime(2026, 12, 4, 9, 30, 15, 800_000, tzinfo=UTC)
    kube.start("ml-team", "web-0", started)  # startTime 09:30:15Z
    before = _unchanged(fleet, mine, theirs)
    for listed_at in (started - timedelta(seconds=5), started - timedelta(milliseconds=500)):
        body = _report(
            fleet,
            [{"namespace": "ml-team", "name": "web-0", "devices": devices}],
            listed_at=listed_at,
        )
        assert body.status_code == 200, body.text
        (outcome,) = body.json()["outcomes"]
        assert outcome["action"] == "deferred", outcome
        assert "before" in outcome["message"]
        assert _unchanged(fleet, mine, theirs) == before
    # A List read a second after the start names this pod's devices: the truth.
    other = [u for u in _uuids() if u not in devices and u not in _held_devices(fleet)][:2]
    body = _report(
        fleet,
        [{"namespace": "ml-team", "name": "web-0", "devices": other}],
        listed_at=started + timedelta(seconds=1),
    )
    (outcome,) = body.json()["outcomes"]
    assert (outcome["action"], outcome["allocation_id"]) == ("moved", mine)


def _held_devices(client: TestClient) -> set[str]:
    return {d for r in _reservations(client) for d in r["devices"]}
