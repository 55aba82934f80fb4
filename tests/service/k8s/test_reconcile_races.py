"""A release decided from a pod list never ends a reservation a bind reused after it.

The reconciler (and the watch's release of a gang) reads the pods, then releases
what they show unused. A bind retried in between reuses a live reservation and
writes its Binding: the pod then runs on it, and a release from the older list
would hand its GPUs to the next pod. The bind stamps the reservation it reuses
before its Binding (``allocations.touch``), and those releases are guarded by
the moment their list was asked for. Each test runs the bind inside the list
call, after the list was read and before it is answered.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.app import create_app
from service.k8s.kube_api import KubeApiError
from service.k8s.pod_request import gang_of
from service.k8s.reconcile import reconcile_once
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

GANG = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}
GANG_KEY = "k8s-gang:ml-team/pair"
GRACE_S = 30.0  # within the agents' heartbeat: the nodes stay fresh past it
LOST = KubeApiError(0, "the Kubernetes API did not answer: TimeoutError()")


class ListThenAct(FakeKubeApi):
    """FakeKubeApi whose next pod list runs ``after_list`` once the pods are read and
    before they are answered: what happens in the cluster while the caller still
    works from that list."""

    def __init__(self) -> None:
        super().__init__()
        self.after_list: Callable[[], None] | None = None

    def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        pods = super().list_pods(namespace)
        act, self.after_list = self.after_list, None
        if act is not None:
            act()
        return pods


@pytest.fixture
def kube() -> ListThenAct:
    return ListThenAct()


def _bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    client.post("/k8s/v1/filter", json=names_args(p, [node]))
    answer = client.post("/k8s/v1/bind", json=binding_args(p, node))
    assert answer.status_code == 200, answer.text
    error: str = answer.json()["Error"]
    return error


def _reconcile(client: TestClient, kube: FakeKubeApi) -> list[str]:
    app: Any = client.app
    return reconcile_once(app.state.service, kube, app.state.k8s.gangs, GRACE_S)


def _state(client: TestClient, allocation_id: str) -> str:
    state: str = client.get(f"/v1/allocations/{allocation_id}").json()["state"]
    return state


def _only_live(client: TestClient, job_id: str) -> str:
    found = client.get("/v1/allocations", params={"job_id": job_id}).json()["allocations"]
    (live,) = [a["id"] for a in found if a["state"] in ("pending", "active")]
    return str(live)


def test_a_bind_retried_while_a_pass_works_from_its_list_keeps_the_reservation_it_reused(
    k8s_client: TestClient, kube: ListThenAct, clock: FakeClock
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    p = kube.add(pod("trainer-0", 4))
    uid = p["metadata"]["uid"]
    kube.refuse_with = LOST  # the Binding's fate unknown: its reservation stays
    assert _bind(k8s_client, p, "h100-a").startswith("topoplace: ")
    kube.refuse_with = None
    reserved = _only_live(k8s_client, uid)
    clock.advance(GRACE_S + 1)  # past the grace: a pass that sees the pod unbound releases it

    def scheduler_retries() -> None:  # the pass has read the pod unbound
        assert _bind(k8s_client, p, "h100-a") == ""

    kube.after_list = scheduler_retries
    assert _reconcile(k8s_client, kube) == []
    bound = kube.pods[("ml-team", "trainer-0")]
    assert bound["spec"]["nodeName"] == "h100-a"
    assert bound["metadata"]["annotations"]["topoplace.io/allocation"] == reserved
    assert _state(k8s_client, reserved) == "active", "the pod runs on it"
    # The GPUs the pod runs on stay held: none is handed to the next pod.
    assert len(k8s_client.get("/v1/nodes/h100-a").json()["free_gpus"]) == 4
    other = kube.add(pod("other-0", 8))
    assert "fewer than 8 GPUs free" in _bind(k8s_client, other, "h100-a")
    # A pass with a list that shows it bound keeps it; one of a pod gone releases it.
    clock.advance(GRACE_S + 1)
    assert _reconcile(k8s_client, kube) == []
    kube.delete("ml-team", "trainer-0")
    assert _reconcile(k8s_client, kube) == [reserved]


def test_a_pass_that_released_first_makes_the_retried_bind_reserve_anew(
    k8s_client: TestClient, kube: ListThenAct, clock: FakeClock
) -> None:
    """The other order: the release lands before the retried bind reuses the reservation;
    the bind then finds it ended and reserves again instead of binding onto it."""
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    p = kube.add(pod("trainer-0", 4))
    uid = p["metadata"]["uid"]
    kube.refuse_with = LOST
    assert _bind(k8s_client, p, "h100-a").startswith("topoplace: ")
    kube.refuse_with = None
    first = _only_live(k8s_client, uid)
    clock.advance(GRACE_S + 1)
    assert _reconcile(k8s_client, kube) == [first]
    assert _bind(k8s_client, p, "h100-a") == ""
    again = _only_live(k8s_client, uid)
    assert again != first
    notes = kube.pods[("ml-team", "trainer-0")]["metadata"]["annotations"]
    assert notes["topoplace.io/allocation"] == again


def test_a_gang_member_bound_while_a_pass_works_from_its_list_keeps_the_gang(
    k8s_client: TestClient, kube: ListThenAct, clock: FakeClock
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    members = [kube.add(pod(f"pair-{i}", 4, annotations=GANG)) for i in range(2)]
    for p in members:
        assert _bind(k8s_client, p, "h100-a") == ""
    reserved = _only_live(k8s_client, GANG_KEY)
    # Both members are deleted while no watch follows (their Job makes them again), and
    # the service restarts: its claims are read afresh from the database and the pods.
    for p in members:
        kube.delete("ml-team", p["metadata"]["name"])
    app: Any = k8s_client.app
    app.state.k8s.gangs.forget(GANG_KEY)
    clock.advance(GRACE_S + 1)
    again = pod("pair-0", 4, annotations=GANG)  # a new UID under the old name

    def member_comes_back() -> None:  # the pass has read no member
        kube.add(again)
        assert _bind(k8s_client, again, "h100-a") == ""

    kube.after_list = member_comes_back
    assert _reconcile(k8s_client, kube) == []
    notes = kube.pods[("ml-team", "pair-0")]["metadata"]["annotations"]
    assert notes["topoplace.io/allocation"] == reserved
    assert _state(k8s_client, reserved) == "active", "the member runs on it"


@contextlib.contextmanager
def _replica(settings: Settings, clock: FakeClock, kube: FakeKubeApi) -> Iterator[TestClient]:
    """A second service process on the same database and API server."""
    app = create_app(settings, clock=clock, background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    app.state.k8s_api = kube
    with TestClient(app) as client:
        yield client


def test_a_member_bound_on_another_replica_while_the_watch_lists_keeps_the_gang(
    k8s_client: TestClient, settings: Settings, kube: ListThenAct, clock: FakeClock
) -> None:
    """The watch of one replica sees the gang's last member go and lists the namespace:
    no member. Meanwhile the Job makes a member again and kube-scheduler binds it through
    the other replica, whose claim takes no lock of the first."""
    add_nodes(k8s_client, ("hgx-h100", "h100-a"))
    members = [kube.add(pod(f"pair-{i}", 4, annotations=GANG)) for i in range(2)]
    for p in members:
        assert _bind(k8s_client, p, "h100-a") == ""
    reserved = _only_live(k8s_client, GANG_KEY)
    for p in members:
        kube.delete("ml-team", p["metadata"]["name"])
    again = pod("pair-0", 4, annotations=GANG)
    app: Any = k8s_client.app
    gang = gang_of(members[1])
    assert gang is not None
    with _replica(settings, clock, kube) as other:

        def bound_on_the_other_replica() -> None:
            clock.advance(1)  # after the list was asked for
            kube.add(again)
            assert _bind(other, again, "h100-a") == ""

        kube.after_list = bound_on_the_other_replica
        assert app.state.k8s.gangs.release_if_ended(gang, members[1]["metadata"]["uid"]) == ()
    assert _state(k8s_client, reserved) == "active", "the new member runs on it"
    # With nobody binding meanwhile, the last member gone releases it.
    kube.delete("ml-team", "pair-0")
    ended = app.state.k8s.gangs.release_if_ended(gang, again["metadata"]["uid"])
    assert ended == (reserved,)
