"""bind reserves the filter's GPUs for the pod, then creates the Binding naming them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.app import create_app
from service.k8s.kube_api import KubeApiError
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from service.tokens import store
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(
        k8s_client, ("hgx-h100", "h100-a"), ("dgx1-v100", "v100-c"), ("pcie-8x-l40s", "l40s-b")
    )
    return k8s_client


def _bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    response = client.post("/k8s/v1/bind", json=binding_args(p, node))
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"Error"}
    error: str = body["Error"]
    return error


def _allocations(client: TestClient, uid: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.get("/v1/allocations", params={"job_id": uid}).json()[
        "allocations"
    ]
    return found


def test_bind_reserves_what_filter_promised_and_binds_with_annotations(
    fleet: TestClient, kube: FakeKubeApi
):
    p = kube.add(pod("trainer-0", 2))
    uid = p["metadata"]["uid"]
    busy = fleet.post("/v1/place", json={"gpus": 3, "nodes": ["v100-c"]})
    assert busy.status_code == 201
    filtered = fleet.post("/k8s/v1/filter", json=names_args(p, ["v100-c"])).json()
    assert filtered["NodeNames"] == ["v100-c"]
    promised = fleet.app.state.k8s._recent[uid].judgement.gpus("v100-c")  # type: ignore[attr-defined]
    assert len(promised) == 2

    assert _bind(fleet, p, "v100-c") == ""
    (allocation,) = _allocations(fleet, uid)
    assert allocation["state"] == "active"
    assert allocation["owner"] == "k8s-pod:ml-team/trainer-0"
    (task,) = allocation["tasks"]
    assert task["node"] == "v100-c"
    assert tuple(task["gpu_indices"]) == promised

    (binding,) = kube.bindings
    assert binding["apiVersion"] == "v1" and binding["kind"] == "Binding"
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "v100-c"}
    meta = binding["metadata"]
    assert (meta["name"], meta["namespace"], meta["uid"]) == ("trainer-0", "ml-team", uid)
    notes = meta["annotations"]
    assert notes["topoplace.io/gpus"] == ",".join(task["gpu_uuids"])
    assert notes["topoplace.io/gpu-indices"] == ",".join(str(i) for i in promised)
    assert notes["topoplace.io/allocation"] == allocation["id"]
    assert kube.pods[("ml-team", "trainer-0")]["spec"]["nodeName"] == "v100-c"


def test_a_retried_bind_does_not_book_twice(fleet: TestClient, kube: FakeKubeApi):
    p = kube.add(pod("trainer-0", 4))
    assert _bind(fleet, p, "h100-a") == ""
    # The reply was lost and the scheduler asks again: the pod is already on the node.
    assert _bind(fleet, p, "h100-a") == ""
    live = [a for a in _allocations(fleet, p["metadata"]["uid"]) if a["state"] == "active"]
    assert len(live) == 1
    free = fleet.get("/v1/nodes/h100-a").json()["free_gpus"]
    assert len(free) == 4


def test_a_refused_binding_releases_the_reservation(fleet: TestClient, kube: FakeKubeApi):
    p = kube.add(pod("trainer-0", 8))
    kube.refuse_with = KubeApiError(403, 'pods "trainer-0" is forbidden')
    error = _bind(fleet, p, "h100-a")
    assert "forbidden" in error and error.startswith("topoplace: ")
    (allocation,) = _allocations(fleet, p["metadata"]["uid"])
    assert allocation["state"] == "released"
    assert len(fleet.get("/v1/nodes/h100-a").json()["free_gpus"]) == 8
    # The next attempt on another node works and holds only that node's GPUs.
    kube.refuse_with = None
    assert _bind(fleet, p, "v100-c") == ""
    states = sorted(a["state"] for a in _allocations(fleet, p["metadata"]["uid"]))
    assert states == ["active", "released"]


def test_a_bind_back_on_the_first_node_reserves_anew(fleet: TestClient, kube: FakeKubeApi):
    # Key N=0 is used on h100-a, N=1 on v100-c (the first key, for another node, is
    # refused as a Conflict at the commit), both Bindings refused and both released: a
    # bind to h100-a again must not replay N=0's released reservation.
    p = kube.add(pod("trainer-0", 2))
    kube.refuse_with = KubeApiError(403, "forbidden")
    assert "forbidden" in _bind(fleet, p, "h100-a")
    assert "forbidden" in _bind(fleet, p, "v100-c")
    kube.refuse_with = None
    assert _bind(fleet, p, "h100-a") == ""
    found = _allocations(fleet, p["metadata"]["uid"])
    assert sorted((a["tasks"][0]["node"], a["state"]) for a in found) == [
        ("h100-a", "active"),
        ("h100-a", "released"),
        ("v100-c", "released"),
    ]
    assert len(fleet.get("/v1/nodes/v100-c").json()["free_gpus"]) == 8
    assert len(fleet.get("/v1/nodes/h100-a").json()["free_gpus"]) == 6


def test_a_first_bind_does_not_read_earlier_reservations(
    fleet: TestClient, kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
):
    # The pod's first reservation goes straight to the commit: the key's unique index
    # is what finds an earlier one, no listing of the pod's reservations first.
    from service.allocations import api as allocations

    reads: list[str | None] = []
    listing = allocations.listing

    def counted(state: Any, job_id: str | None, *rest: Any) -> Any:
        reads.append(job_id)
        return listing(state, job_id, *rest)

    monkeypatch.setattr(allocations, "listing", counted)
    p = kube.add(pod("trainer-0", 4))
    assert _bind(fleet, p, "h100-a") == ""
    assert reads == []
    assert _bind(fleet, p, "h100-a") == ""  # a retry takes the careful path, and books once
    assert reads == [p["metadata"]["uid"]]
    assert (
        len([a for a in _allocations(fleet, p["metadata"]["uid"]) if a["state"] == "active"]) == 1
    )


def test_a_first_bind_is_written_on_its_own_worker_thread(
    fleet: TestClient, kube: FakeKubeApi
) -> None:
    # kube-scheduler waits on each bind: no hand-over to the group committer's thread.
    committer = fleet.app.state.service.committer  # type: ignore[attr-defined]
    before = committer.at_once
    p = kube.add(pod("trainer-0", 2))
    assert _bind(fleet, p, "h100-a") == ""
    assert committer.at_once - before == 1
    assert _bind(fleet, p, "h100-a") == ""  # the retry finds the reservation written
    assert len(_allocations(fleet, p["metadata"]["uid"])) == 1


def test_bind_without_a_filter_reads_the_pod_from_the_api(fleet: TestClient, kube: FakeKubeApi):
    p = kube.add(pod("trainer-1", 8, annotations={"topoplace.io/locality": "nvlink"}))
    assert _bind(fleet, p, "h100-a") == ""
    (allocation,) = _allocations(fleet, p["metadata"]["uid"])
    assert allocation["tasks"][0]["gpu_indices"] == list(range(8))


def test_bind_to_a_node_that_cannot_take_the_pod_fails_and_holds_nothing(
    fleet: TestClient, kube: FakeKubeApi
):
    p = kube.add(pod("big", 8, annotations={"topoplace.io/locality": "nvlink"}))
    error = _bind(fleet, p, "l40s-b")
    assert error.startswith("topoplace: cannot reserve GPUs on l40s-b")
    assert kube.bindings == []
    assert _allocations(fleet, p["metadata"]["uid"]) == []


def test_bind_of_a_pod_that_is_gone_reports_it(fleet: TestClient):
    p = pod("vanished", 1)
    error = _bind(fleet, p, "h100-a")
    assert "does not exist" in error


def test_a_pod_without_gpus_is_bound_without_a_reservation(fleet: TestClient, kube: FakeKubeApi):
    p = kube.add(pod("web", 0))
    assert _bind(fleet, p, "h100-a") == ""
    assert kube.bindings[0]["metadata"]["annotations"] == {}
    assert _allocations(fleet, p["metadata"]["uid"]) == []


def test_bind_args_are_checked(fleet: TestClient):
    response = fleet.post(
        "/k8s/v1/bind", json={"PodName": "x", "PodNamespace": "", "PodUID": "u", "Node": "n"}
    )
    assert response.status_code == 400
    assert "PodNamespace" in response.json()["error"]["message"]


def test_a_bind_that_cannot_reserve_is_a_refused_decision_in_the_audit_log(
    fleet: TestClient, kube: FakeKubeApi
):
    p = kube.add(pod("trainer-big", 8))
    assert _bind(fleet, p, "h100-a") == ""
    q = kube.add(pod("trainer-late", 8))
    error = _bind(fleet, q, "h100-a")  # h100-a's 8 GPUs are held
    assert error.startswith("topoplace: ")
    refused = fleet.get("/v1/audit", params={"action": "refused"}).json()["entries"]
    [entry] = refused
    assert (entry["route"], entry["job_id"]) == ("POST /k8s/v1/bind", q["metadata"]["uid"])
    assert entry["detail"]["code"] == "unschedulable" and entry["detail"]["reasons"]


def test_a_retried_bind_of_a_pod_filling_its_node_is_a_bind(fleet: TestClient, kube: FakeKubeApi):
    # The first bind's answer was lost; the retry finds h100-a full of the pod's own GPUs.
    p = kube.add(pod("trainer-0", 8))
    assert _bind(fleet, p, "h100-a") == ""
    assert _bind(fleet, p, "h100-a") == ""
    (allocation,) = _allocations(fleet, p["metadata"]["uid"])
    assert allocation["state"] == "active"
    assert fleet.get("/v1/nodes/h100-a").json()["free_gpus"] == []


# -- a scheduler token revoked while its bind is in flight ------------------------------

RING = {"topoplace.io/gang": "ring", "topoplace.io/gang-size": "2"}


class RevokingKube(FakeKubeApi):
    """The API server, slow to answer a read of the pod: the scheduler's token is revoked
    meanwhile (``revoke``, once armed)."""

    def __init__(self) -> None:
        super().__init__()
        self.revoke: Callable[[], None] | None = None

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        revoke, self.revoke = self.revoke, None
        if revoke is not None:
            revoke()
        return super().get_pod(namespace, name)


@dataclass
class Guarded:
    client: TestClient
    kube: RevokingKube
    scheduler: dict[str, str]
    token_id: str

    def bind(self, p: dict[str, Any], node: str) -> str:
        response = self.client.post(
            "/k8s/v1/bind", json=binding_args(p, node), headers=self.scheduler
        )
        assert response.status_code == 200, response.text
        error: str = response.json()["Error"]
        return error

    def revoke_on_read(self) -> None:
        """The token is revoked (and this process told) while the next read waits."""
        token_id = self.token_id
        state = self.client.app.state  # type: ignore[attr-defined]

        def revoke() -> None:
            assert store.revoke(state.service.engine, token_id) is not None
            state.token_check.drop(token_id)

        self.kube.revoke = revoke

    def allocations(self) -> list[dict[str, Any]]:
        answer = self.client.get("/v1/allocations", headers=ADMIN)
        listed: list[dict[str, Any]] = answer.json()["allocations"]
        return listed


@pytest.fixture
def guarded(settings: Settings, clock: FakeClock) -> Iterator[Guarded]:
    app = create_app(secured(settings), clock=clock, background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    kube = RevokingKube()
    app.state.k8s_api = kube
    with TestClient(app, headers=ADMIN) as client:
        add_nodes(client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"))
        made = client.post("/v1/tokens", json={"role": "scheduler", "name": "kube-scheduler"})
        assert made.status_code == 201, made.text
        token = {"Authorization": f"Bearer {made.json()['token']}"}
        assert client.get("/v1/nodes", headers=token).status_code == 200  # verified once
        yield Guarded(client, kube, token, made.json()["id"])


def _refused_as_revoked(error: str) -> None:
    assert error.startswith("topoplace: "), error
    assert "revoked while this request was in flight" in error


def test_a_first_bind_whose_token_is_revoked_meanwhile_reserves_and_binds_nothing(
    guarded: Guarded,
) -> None:
    p = guarded.kube.add(pod("trainer-0", 2))
    guarded.revoke_on_read()
    _refused_as_revoked(guarded.bind(p, "h100-a"))
    assert guarded.allocations() == []
    assert guarded.kube.bindings == []


def test_a_pod_without_gpus_whose_token_is_revoked_meanwhile_is_not_bound(
    guarded: Guarded,
) -> None:
    p = guarded.kube.add(pod("sidecar-0"))
    guarded.revoke_on_read()
    _refused_as_revoked(guarded.bind(p, "h100-a"))
    assert guarded.kube.bindings == []


def test_a_retried_bind_whose_token_is_revoked_meanwhile_does_not_bind(
    guarded: Guarded,
) -> None:
    """The first Binding's fate was unknown (a 5xx): its reservation stays for the retry.
    The retry, its token revoked while the pod was read, must not bind on it."""
    p = guarded.kube.add(pod("trainer-0", 2))
    guarded.kube.refuse_with = KubeApiError(503, "etcd is slow")
    assert "etcd is slow" in guarded.bind(p, "h100-a")
    (kept,) = guarded.allocations()
    guarded.kube.refuse_with = None
    guarded.revoke_on_read()
    _refused_as_revoked(guarded.bind(p, "h100-a"))
    assert guarded.kube.bindings == []
    assert guarded.allocations() == [kept]  # not stamped as reused either


def test_a_gang_member_whose_token_is_revoked_meanwhile_is_not_bound(
    guarded: Guarded,
) -> None:
    first = guarded.kube.add(pod("ring-0", 8, annotations=RING))
    second = guarded.kube.add(pod("ring-1", 8, annotations=RING))
    assert guarded.bind(first, "h100-a") == ""
    (gang,) = guarded.allocations()
    guarded.revoke_on_read()
    _refused_as_revoked(guarded.bind(second, "h100-b"))
    assert [b["metadata"]["name"] for b in guarded.kube.bindings] == ["ring-0"]
    assert guarded.allocations() == [gang]


@pytest.mark.parametrize("connected", [False, True])
def test_a_bind_naming_one_pod_with_another_pods_uid_binds_neither(
    fleet: TestClient, kube: FakeKubeApi, connected: bool
):
    # ExtenderBindingArgs names the pod by PodNamespace/PodName and its incarnation by
    # PodUID. The UID alone picked the pod filter had seen: 'b' with 'a''s UID bound 'a'
    # and answered that 'b' was bound. The first bind connects on a worker thread; once
    # connected, a remembered pod's bind runs on the event loop: both are checked.
    if connected:
        assert _bind(fleet, kube.add(pod("web", 0)), "h100-a") == ""
    a = kube.add(pod("a", 2))
    b = kube.add(pod("b", 2))
    assert fleet.post("/k8s/v1/filter", json=names_args(a, ["h100-a"])).status_code == 200
    mixed = {**binding_args(b, "h100-a"), "PodUID": a["metadata"]["uid"]}
    assert "ml-team/b is now another pod" in _bind_args(fleet, mixed)
    assert [x["metadata"]["name"] for x in kube.bindings] == ["web"] * connected
    kube.bindings.clear()
    assert _allocations(fleet, a["metadata"]["uid"]) == []
    assert _bind(fleet, a, "h100-a") == ""
    assert [x["metadata"]["name"] for x in kube.bindings] == ["a"]


def _bind_args(client: TestClient, args: dict[str, str]) -> str:
    response = client.post("/k8s/v1/bind", json=args)
    assert response.status_code == 200, response.text
    error: str = response.json()["Error"]
    return error
