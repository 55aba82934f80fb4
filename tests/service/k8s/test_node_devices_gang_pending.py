"""A member's report on the GPUs its task was given makes its gang's pending reservation run."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.allocations import api as allocations
from service.allocations.results import Allocation
from service.errors import Unavailable
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODE = "h100-a"
GANG = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}


def test_a_member_reported_on_its_tasks_gpus_takes_the_ttl_off_its_gangs_reservation(
    k8s_client: TestClient,
    kube: FakeKubeApi,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first member bound, the confirm of the gang's reservation lost to a database
    blink: the reservation stays pending, with the gang's TTL. The member runs on the
    very GPUs its task was given, and its node's report says so: the reservation must
    lose its TTL (docs/kubernetes.md, "Giving GPUs back"), as it does when the member is
    moved. Before, a member found on its Binding's GPUs was answered ``matched`` before
    its truth was taken, the TTL stayed, and with no reconciler pass to confirm it the
    sweep ended the reservation under the running member: its GPUs looked free."""
    add_nodes(k8s_client, ("hgx-h100", NODE))
    member = kube.add(pod("pair-0", 2, annotations=GANG))
    assert k8s_client.post("/k8s/v1/filter", json=names_args(member, [NODE])).json()[
        "NodeNames"
    ] == [NODE]

    def blink(*args: Any, **kwargs: Any) -> Allocation:
        raise Unavailable("the database is unreachable")

    monkeypatch.setattr(allocations, "confirm", blink)
    assert k8s_client.post("/k8s/v1/bind", json=binding_args(member, NODE)).json() == {"Error": ""}
    monkeypatch.undo()
    kube.start("ml-team", "pair-0")
    found = kube.get_pod("ml-team", "pair-0") or {}
    notes = found["metadata"]["annotations"]
    gang_id = notes["topoplace.io/allocation"]
    assert k8s_client.get(f"/v1/allocations/{gang_id}").json()["state"] == "pending"

    body = {
        "namespace": "ml-team",
        "name": "pair-0",
        "devices": notes["topoplace.io/gpus"].split(","),
    }
    answer = k8s_client.post(
        f"/v1/nodes/{NODE}/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": [body]}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outcomes"][0]["action"] == "matched", answer.text

    now = k8s_client.get(f"/v1/allocations/{gang_id}").json()
    assert now["state"] == "active" and now["expires_at"] is None, now
    clock.advance(3600)  # past the gang's TTL
    k8s_client.post(f"/v1/nodes/{NODE}/heartbeat")
    state: ServiceState = k8s_client.app.state.service  # type: ignore[attr-defined]
    assert allocations.sweep(state).ids == ()
    assert k8s_client.get(f"/v1/allocations/{gang_id}").json()["state"] == "active"
