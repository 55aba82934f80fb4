"""A node's device report answered after a newer one of the same resource changes nothing.

The plugin reports each round's List; a report that timed out at the plugin may still
be worked on by the service after the next round's report was taken (the plugin moved
on). The kubelet gives a finished pod's devices to the next pod before the API shows
the first one finished, so the older List names the first pod on devices the newer one
gave the next: taken last, it moved them back to the pod that no longer runs, and the
pod on them held nothing until the next round.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from placement.profiles import build_profile
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODE = "h100-a"


def bound_and_started(kube: FakeKubeApi, name: str, started: datetime) -> None:
    """A 1-GPU pod of ``name`` bound to NODE by hand (not through the extender), running
    since ``started``."""
    kube.add(pod(name, 1))
    kube.pods[("ml-team", name)]["spec"]["nodeName"] = NODE
    kube.start("ml-team", name, started)


def _report(client: TestClient, name: str, devices: list[str], listed_at: datetime) -> Any:
    body = {
        "resource": "nvidia.com/gpu",
        "pods": [{"namespace": "ml-team", "name": name, "devices": devices}],
        "listed_at": listed_at.isoformat(),
    }
    answer = client.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)
    assert answer.status_code == 200, answer.text
    (outcome,) = answer.json()["outcomes"]
    return outcome


def _holder(client: TestClient, device: str) -> str | None:
    listed = client.get("/v1/allocations", params={"node": NODE}).json()["allocations"]
    owners = [
        a["owner"]
        for a in listed
        if a["state"] in ("pending", "active", "degraded")
        for t in a["tasks"]
        if device in t["gpu_uuids"]
    ]
    assert len(owners) <= 1, owners
    return owners[0] if owners else None


def test_an_older_list_answered_after_a_newer_one_moves_nothing_back(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    add_nodes(k8s_client, ("hgx-h100", NODE))
    started = datetime.now(UTC) - timedelta(minutes=10)
    first = kube.add(pod("first", 1))
    assert k8s_client.post("/k8s/v1/filter", json=names_args(first, [NODE])).status_code == 200
    assert k8s_client.post("/k8s/v1/bind", json=binding_args(first, NODE)).json()["Error"] == ""
    kube.start("ml-team", "first", started)
    device = str(kube.pods[("ml-team", "first")]["metadata"]["annotations"]["topoplace.io/gpus"])
    # "first" ended on its node; the API still shows it Running. The kubelet gave its GPU
    # to "next", bound by hand.
    bound_and_started(kube, "next", started + timedelta(minutes=5))
    now = datetime.now(UTC)
    taken = _report(k8s_client, "next", [device], now)
    assert taken["action"] == "created"
    assert _holder(k8s_client, device) == "k8s-pod:ml-team/next"
    # The round before's report, answered last.
    stale = _report(k8s_client, "first", [device], now - timedelta(seconds=10))
    assert stale["action"] == "deferred", stale
    assert "newer" in stale["message"]
    assert _holder(k8s_client, device) == "k8s-pod:ml-team/next"


def test_a_list_older_by_more_than_a_report_is_held_up_is_taken(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    """The node's clock stepped back: its reports are not refused until it catches up."""
    add_nodes(k8s_client, ("hgx-h100", NODE))
    started = datetime.now(UTC) - timedelta(hours=3)
    for name in ("one", "two"):
        bound_and_started(kube, name, started)
    devices = [g.uuid for g in build_profile("hgx-h100", NODE).gpus][:2]
    now = datetime.now(UTC)
    assert _report(k8s_client, "one", devices[:1], now)["action"] == "created"
    stepped = now - timedelta(hours=1)
    assert _report(k8s_client, "two", devices[1:], stepped)["action"] == "created"
    # And the rounds after it, a few seconds apart by the node's clock, as well.
    later = stepped + timedelta(seconds=10)
    assert _report(k8s_client, "two", devices[1:], later)["action"] == "matched"


def test_a_report_for_a_node_never_reported_keeps_nothing(k8s_client: TestClient) -> None:
    """404, and no per-node lock is kept for the name: a caller sending made-up names
    must not grow the service's memory one name at a time."""
    body = {"resource": "nvidia.com/gpu", "pods": [], "listed_at": datetime.now(UTC).isoformat()}
    for i in range(50):
        answer = k8s_client.post(f"/v1/nodes/ghost-{i}/k8s/devices", json=body)
        assert answer.status_code == 404, answer.text
    locks = getattr(k8s_client.app.state, "k8s_report_locks", None)  # type: ignore[attr-defined]
    assert locks is None or locks._nodes == {}
