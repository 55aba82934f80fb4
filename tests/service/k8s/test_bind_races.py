"""A bind whose Binding's fate is unknown, and binds of one pod racing each other.

The pod may run on the GPUs a Binding named as soon as the API server applied
it, answered or not: those GPUs must stay held. A reservation goes back only
when the API server's answer, or a read of the pod, says the pod is not there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.allocations import api as allocations
from service.allocations.schemas import PlaceRequest
from service.k8s.kube_api import KubeApiError
from service.k8s.reconcile import reconcile_once
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

Bind = tuple[str, str, str, str, dict[str, str]]
Step = Callable[["ScriptedKube", Bind], Awaitable[None]]
LOST = KubeApiError(0, "the Kubernetes API did not answer: TimeoutError()")


class ScriptedKube(FakeKubeApi):
    """FakeKubeApi whose Binding POSTs on the event loop follow a script, one step a call
    (none left: the POST as FakeKubeApi makes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.script: list[Step] = []

    async def bind_async(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        call = (namespace, name, uid, node, annotations)
        if self.script:
            await self.script.pop(0)(self, call)
        else:
            self.bind(*call)


@pytest.fixture
def kube() -> ScriptedKube:
    return ScriptedKube()


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(k8s_client, ("hgx-h100", "node-a"), ("hgx-h100", "node-b"))
    k8s_client.app.state.k8s.kube()  # type: ignore[attr-defined]  # binds run on the loop
    return k8s_client


def _live(client: TestClient, uid: str) -> list[str]:
    """The nodes of the pod's live reservations."""
    found = client.get("/v1/allocations", params={"job_id": uid}).json()["allocations"]
    return sorted(a["tasks"][0]["node"] for a in found if a["state"] in ("active", "pending"))


def _bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    client.post("/k8s/v1/filter", json=names_args(p, ["node-a", "node-b"]))
    answer = client.post("/k8s/v1/bind", json=binding_args(p, node))
    assert answer.status_code == 200, answer.text
    error: str = answer.json()["Error"]
    return error


def _on_loop(client: TestClient, p: dict[str, Any], node: str) -> Awaitable[str]:
    async def bind() -> str:
        body = json.dumps(binding_args(p, node)).encode()
        answer = await client.app.state.k8s.bind_async(body)  # type: ignore[attr-defined]
        error: str = json.loads(answer)["Error"]
        return error

    return bind()


def _held(gate: asyncio.Event, entered: asyncio.Event, outcome: KubeApiError | None) -> Step:
    """A POST that waits for ``gate``, then is applied, then fails with ``outcome``."""

    async def step(fake: ScriptedKube, call: Bind) -> None:
        entered.set()
        await gate.wait()
        fake.bind(*call)
        if outcome is not None:
            raise outcome

    return step


async def _lost(fake: ScriptedKube, call: Bind) -> None:
    fake.bind(*call)  # applied; the answer never came
    raise LOST


async def _unanswered(fake: ScriptedKube, call: Bind) -> None:
    raise LOST  # not applied, and nothing says so


async def _server_error(fake: ScriptedKube, call: Bind) -> None:
    raise KubeApiError(500, "etcdserver: request timed out")


def test_a_binding_applied_whose_answer_was_lost_is_a_bind(
    fleet: TestClient, kube: ScriptedKube
) -> None:
    p = kube.add(pod("trainer-0", 4))
    kube.script = [_lost]
    assert _bind(fleet, p, "node-a") == ""
    assert _live(fleet, p["metadata"]["uid"]) == ["node-a"]
    # The next pod is not given the GPUs trainer-0 runs on.
    other = kube.add(pod("other-0", 8))
    assert "fewer than 8 GPUs free" in _bind(fleet, other, "node-a")


@pytest.mark.parametrize("outcome", [_unanswered, _server_error], ids=["no answer", "500"])
def test_a_binding_of_unknown_fate_keeps_its_gpus_until_the_reconciler_knows(
    fleet: TestClient, kube: ScriptedKube, clock: FakeClock, outcome: Step
) -> None:
    p = kube.add(pod("trainer-0", 4))
    uid = p["metadata"]["uid"]
    kube.script = [outcome]
    assert _bind(fleet, p, "node-a").startswith("topoplace: ")
    assert _live(fleet, uid) == ["node-a"]  # it may yet run there
    # kube-scheduler's retry replays the same reservation and binds.
    assert _bind(fleet, p, "node-a") == ""
    assert _live(fleet, uid) == ["node-a"]
    # Had it not retried, the reconciler gives the GPUs back once the grace is over.
    q = kube.add(pod("trainer-1", 4))
    kube.script = [outcome]
    assert _bind(fleet, q, "node-b") != ""
    app: Any = fleet.app
    clock.advance(61)
    assert len(reconcile_once(app.state.service, kube, app.state.k8s.gangs, 60.0)) == 1
    assert _live(fleet, q["metadata"]["uid"]) == []
    assert _live(fleet, uid) == ["node-a"]


def test_a_settled_refusal_still_gives_the_gpus_back(fleet: TestClient, kube: ScriptedKube):
    p = kube.add(pod("trainer-0", 4))
    kube.refuse_with = KubeApiError(403, 'pods "trainer-0" is forbidden')
    assert "forbidden" in _bind(fleet, p, "node-a")
    assert _live(fleet, p["metadata"]["uid"]) == []


def test_a_409_for_a_pod_made_again_under_the_name_is_no_bind(
    fleet: TestClient, kube: ScriptedKube
) -> None:
    """A StatefulSet's web-0 deleted and made again, the new one already on the node: the
    old UID's Binding gets 409, and the node name alone would call it done."""
    old = kube.add(pod("web-0", 4))
    fleet.post("/k8s/v1/filter", json=names_args(old, ["node-a"]))
    kube.delete("ml-team", "web-0")
    new = pod("web-0", 4)
    new["spec"]["nodeName"] = "node-a"
    kube.add(new)
    answer = fleet.post("/k8s/v1/bind", json=binding_args(old, "node-a")).json()
    assert "409" in answer["Error"] or "UID" in answer["Error"]
    assert _live(fleet, old["metadata"]["uid"]) == []


def test_a_retried_bind_racing_a_slow_first_keeps_the_reservation_both_share(
    fleet: TestClient, kube: ScriptedKube
) -> None:
    """kube-scheduler gave up on bind #1 (its POST hangs) and binds again to the same node:
    #2 replays #1's reservation and binds; #1 then ends with no answer, and finds the
    pod on its node: a bind too."""
    p = kube.add(pod("trainer-0", 4))
    fleet.post("/k8s/v1/filter", json=names_args(p, ["node-a"]))

    async def scenario() -> tuple[str, str]:
        gate, entered = asyncio.Event(), asyncio.Event()

        async def hangs_then_lost(fake: ScriptedKube, call: Bind) -> None:
            entered.set()
            await gate.wait()
            raise LOST

        kube.script = [hangs_then_lost]
        first = asyncio.ensure_future(_on_loop(fleet, p, "node-a"))
        await entered.wait()
        second = await _on_loop(fleet, p, "node-a")
        gate.set()
        return await first, second

    first, second = fleet.portal.call(scenario)  # type: ignore[union-attr]
    assert (first, second) == ("", "")
    assert kube.pods[("ml-team", "trainer-0")]["spec"]["nodeName"] == "node-a"
    assert _live(fleet, p["metadata"]["uid"]) == ["node-a"]


@pytest.mark.parametrize("lands_first", ["node-a", "node-b"])
def test_binds_of_one_pod_to_two_nodes_keep_the_reservation_it_runs_on(
    fleet: TestClient, kube: ScriptedKube, lands_first: str
) -> None:
    """Bind #1 to node-a hangs; kube-scheduler binds the pod to node-b. Whichever Binding
    the API server applies first, the pod keeps the GPUs of that node, and only those."""
    p = kube.add(pod("trainer-0", 4))
    fleet.post("/k8s/v1/filter", json=names_args(p, ["node-a", "node-b"]))

    async def scenario() -> tuple[str, str]:
        gates = {"node-a": asyncio.Event(), "node-b": asyncio.Event()}
        entered = {"node-a": asyncio.Event(), "node-b": asyncio.Event()}
        kube.script = [_held(gates[n], entered[n], None) for n in ("node-a", "node-b")]
        first = asyncio.ensure_future(_on_loop(fleet, p, "node-a"))
        await entered["node-a"].wait()
        second = asyncio.ensure_future(_on_loop(fleet, p, "node-b"))
        await entered["node-b"].wait()
        later = "node-b" if lands_first == "node-a" else "node-a"
        gates[lands_first].set()
        await asyncio.sleep(0.05)
        gates[later].set()
        return await first, await second

    first, second = fleet.portal.call(scenario)  # type: ignore[union-attr]
    assert kube.pods[("ml-team", "trainer-0")]["spec"]["nodeName"] == lands_first
    assert (first == "", second == "") == (lands_first == "node-a", lands_first == "node-b")
    assert _live(fleet, p["metadata"]["uid"]) == [lands_first]


def test_a_late_retried_bind_of_a_pod_that_finished_holds_nothing(
    fleet: TestClient, kube: ScriptedKube
) -> None:
    """Bind #1's Binding was applied and its answer lost; the pod ran, finished and its
    reservation was released at its end. kube-scheduler's retry of the bind comes after:
    the pod is on the node, but it runs on nothing any more, so the GPUs the retry
    reserved again go back at once, not after the reconciler's grace."""
    p = kube.add(pod("trainer-0", 4))
    uid = p["metadata"]["uid"]
    kube.script = [_lost]
    assert _bind(fleet, p, "node-a") == ""
    kube.pods[("ml-team", "trainer-0")]["status"] = {"phase": "Succeeded"}
    service: Any = fleet.app
    released = allocations.release_job(service.state.service, uid, ended=True)  # the watch
    assert len(released.ids) == 1
    assert _bind(fleet, p, "node-a") != ""
    assert _live(fleet, uid) == []


def test_a_bind_after_a_thousand_refused_binds_reserves_anew(
    fleet: TestClient, kube: ScriptedKube
) -> None:
    """A pod whose Bindings the API server refused for hours (the service's account
    lacking ``pods/binding``): each try reserved under the next key and gave it back.
    Once the Binding is allowed, the bind must hold the GPUs it names, not replay an
    ended reservation under a key counted short (the earlier ones were counted from a
    listing of at most 1,000)."""
    p = kube.add(pod("trainer-0", 2))
    uid = p["metadata"]["uid"]
    fleet.post("/k8s/v1/filter", json=names_args(p, ["node-a"]))
    service: Any = fleet.app
    state = service.state.service
    extender = service.state.k8s
    asked = extender._recent[uid].pod  # what the bind reserves with, as _bind_flow says it
    request = PlaceRequest.model_validate(
        {
            **asked.request.model_dump(),
            "nodes": ["node-a"],
            "job_id": uid,
            "owner": asked.owner,
            "ttl_s": extender.settings.bind_ttl_s,
        }
    )
    for n in range(1_002):  # what 1,002 refused binds left
        placed = allocations.place(state, request, f"k8s-pod:{uid}:{n}", True)
        allocations.release(state, placed.allocation.id)
    assert _bind(fleet, p, "node-a") == ""
    notes = kube.pods[("ml-team", "trainer-0")]["metadata"]["annotations"]
    named = fleet.get(f"/v1/allocations/{notes['topoplace.io/allocation']}").json()
    assert named["state"] == "active"
    assert len(fleet.get("/v1/nodes/node-a").json()["free_gpus"]) == 6  # its 2 are held


def test_a_bind_whose_key_replays_an_ended_reservation_binds_nothing(
    fleet: TestClient, kube: ScriptedKube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two binds of one pod counting the same next key, the first's reservation given back
    (its Binding refused) before the second replays it: the second must not write a
    Binding naming GPUs nobody holds."""
    p = kube.add(pod("trainer-0", 2))
    kube.refuse_with = KubeApiError(403, "forbidden")
    assert "forbidden" in _bind(fleet, p, "node-a")
    kube.refuse_with = None
    monkeypatch.setattr(allocations, "count_for_job", lambda state, job_id: 0)
    error = _bind(fleet, p, "node-a")
    assert "has ended" in error
    assert kube.bindings == []
    assert _live(fleet, p["metadata"]["uid"]) == []
