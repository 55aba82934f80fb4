"""Every change to an allocation publishes exactly one event, whoever made it.

A watcher subscribes to the state's event hub, as the gRPC Watch stream
does; after each action the test publishes a marker and reads up to it, so
the events in between are exactly those the action published. Each event
has its one audit row (service/audit/), written with the change: the rows
since the last mark are checked to be the same changes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, pod
from service.allocations import api
from service.allocations.results import Allocation
from service.allocations.schemas import PlaceRequest
from service.events import Event, EventHub
from service.k8s.reconcile import reconcile_once
from service.schema import audit_log
from service.slurm.reconcile import reconcile
from service.slurm.settings import SlurmSettings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s import fixtures
from tests.service.k8s.fake_kube import FakeKubeApi

NO_VAL = 4294967294


class Watcher:
    """A subscription on a loop of its own thread, read up to a marker; and the audit
    log's allocation rows written since the last mark."""

    def __init__(self, hub: EventHub, engine: sa.Engine) -> None:
        self.hub = hub
        self.engine = engine
        self.audited = self._last_audit_id()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.marks = itertools.count()

        async def subscribe() -> Any:
            sub = hub.subscribe()
            started = await sub.next()
            assert started is not None and started.type == "started"
            return sub

        self.sub = asyncio.run_coroutine_threadsafe(subscribe(), self.loop).result(10)

    def since_last(self, one_per_audit_row: bool = True) -> list[tuple[str, str, str]]:
        """(type, allocation id, allocation state) of the allocation events since the last
        call; ``one_per_audit_row``: checked to be the audit rows written since."""
        mark = f"mark-{next(self.marks)}"
        self.hub.publish("node", "mark", node=mark)

        async def read() -> list[Event]:
            seen: list[Event] = []
            while True:
                event = await self.sub.next()
                assert event is not None, "the watcher was closed"
                if event.kind == "node" and event.node == mark:
                    return seen
                seen.append(event)

        events = asyncio.run_coroutine_threadsafe(read(), self.loop).result(10)
        out: list[tuple[str, str, str]] = []
        for e in events:
            if e.kind == "allocation":
                assert e.allocation is not None
                out.append((e.type, e.allocation.id, e.allocation.state))
        audited = self._audited_since()
        if one_per_audit_row:
            assert sorted(audited) == sorted(out), "one audit row per event"
        return out

    def _last_audit_id(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(audit_log.c.id))).scalar() or 0)

    def _audited_since(self) -> list[tuple[str, str, str]]:
        query = sa.select(audit_log).where(
            audit_log.c.id > self.audited, audit_log.c.kind == "allocation"
        )
        with self.engine.connect() as conn:
            rows = list(conn.execute(query.order_by(audit_log.c.id)).mappings())
        self.audited = self._last_audit_id()
        out = []
        for row in rows:
            state = json.loads(row["detail"])["state"]  # as the change left it
            out.append((row["action"], row["allocation_id"], state))
        return out

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.sub.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


# The extender's app and its fake Kubernetes API, as the extender's own tests have them.
kube = fixtures.kube
k8s_client = fixtures.k8s_client


@pytest.fixture
def state(k8s_client: TestClient) -> ServiceState:
    service: ServiceState = k8s_client.app.state.service  # type: ignore[attr-defined]
    return service


@pytest.fixture
def watcher(state: ServiceState) -> Iterator[Watcher]:
    w = Watcher(state.events, state.engine)
    yield w
    w.close()


def _bind(client: TestClient, p: dict[str, Any], node: str) -> None:
    assert client.post("/k8s/v1/bind", json=binding_args(p, node)).json() == {"Error": ""}


def _only_id(client: TestClient, job_id: str) -> str:
    [allocation] = client.get("/v1/allocations", params={"job_id": job_id}).json()["allocations"]
    return str(allocation["id"])


def test_a_kubernetes_bind_publishes_one_event_per_change(
    k8s_client: TestClient, kube: FakeKubeApi, watcher: Watcher
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "h0"))
    watcher.since_last()
    p = kube.add(pod("train", 2))
    _bind(k8s_client, p, "h0")
    allocation = _only_id(k8s_client, p["metadata"]["uid"])
    # One change: a pod's reservation is made active at once, before its Binding.
    assert watcher.since_last() == [("placed", allocation, "active")]
    _bind(k8s_client, p, "h0")  # a scheduler's retry: the same reservation, no change
    assert watcher.since_last() == []


def test_a_gang_publishes_its_reservation_once_not_per_member(
    k8s_client: TestClient, kube: FakeKubeApi, watcher: Watcher
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "h0"))
    notes = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}
    members = [kube.add(pod(f"pair-{i}", 4, annotations=notes)) for i in range(2)]
    watcher.since_last()
    _bind(k8s_client, members[0], "h0")
    gang = _only_id(k8s_client, "k8s-gang:ml-team/pair")
    assert watcher.since_last() == [("placed", gang, "pending"), ("confirmed", gang, "active")]
    _bind(k8s_client, members[1], "h0")  # claims a task of the same reservation
    assert watcher.since_last() == []


def test_a_kubernetes_reconcile_release_publishes_one_event(
    k8s_client: TestClient, kube: FakeKubeApi, watcher: Watcher, clock: FakeClock
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "h0"))
    p = kube.add(pod("gone", 2))
    _bind(k8s_client, p, "h0")
    allocation = _only_id(k8s_client, p["metadata"]["uid"])
    kube.delete("ml-team", "gone")
    clock.advance(61)
    watcher.since_last()
    app: Any = k8s_client.app
    assert reconcile_once(app.state.service, kube, app.state.k8s.gangs, 60.0) == [allocation]
    assert watcher.since_last() == [("released", allocation, "released")]
    assert reconcile_once(app.state.service, kube, app.state.k8s.gangs, 60.0) == []
    assert watcher.since_last() == []


def test_a_slurm_reconcile_publishes_one_event_per_change(
    k8s_client: TestClient, state: ServiceState, watcher: Watcher
) -> None:
    add_nodes(k8s_client, ("dgx1-v100", "node1"))
    body = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "user_name": "alice"}
    decision = k8s_client.post(
        "/v1/slurm/job-submit", json={**body, "tres_per_node": "gres:gpu:1"}
    ).json()
    [reserved] = decision["allocation_ids"]
    assert watcher.since_last() == [("placed", reserved, "active")]  # the filter's reservation

    settings = SlurmSettings(reconcile_grace_s=60)
    cancelled = {
        "job_id": 11,
        "job_state": "CANCELLED",
        "admin_comment": decision["set"]["admin_comment"],
    }
    running = {
        "job_id": 12,
        "job_state": "RUNNING",
        "user_name": "bob",
        "nodes": "node1",
        "gres_detail": ["gpu:2(IDX:3-4)"],
        "admin_comment": "",
    }
    result = reconcile(state, settings, {"jobs": [cancelled, running]})
    [observed] = result.observed
    assert result.released == [reserved]
    # Slurm's running job is recorded (one allocation made), the cancelled one's released.
    assert sorted(watcher.since_last()) == [
        ("placed", observed, "active"),
        ("released", reserved, "released"),
    ]
    assert reconcile(state, settings, {"jobs": [running]}).observed == []  # matched
    assert watcher.since_last() == []
    finished = {**running, "job_state": "COMPLETED"}
    assert reconcile(state, settings, {"jobs": [finished]}).released == [observed]
    assert watcher.since_last() == [("released", observed, "released")]


def test_a_slurm_prolog_that_moves_a_job_publishes_moved_and_released(
    k8s_client: TestClient, watcher: Watcher
) -> None:
    add_nodes(k8s_client, ("dgx1-v100", "node1"))
    stale = k8s_client.post("/v1/place", json={"gpus": 1, "nodes": ["node1"]}).json()["id"]
    body = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL, "user_name": "alice"}
    decision = k8s_client.post(
        "/v1/slurm/job-submit", json={**body, "tres_per_node": "gres:gpu:1"}
    ).json()
    [mine] = decision["allocation_ids"]
    held = k8s_client.get(f"/v1/allocations/{stale}").json()["tasks"][0]["gpu_indices"][0]
    watcher.since_last()
    # Slurm runs the job on the GPU the stale reservation holds.
    show_job = (
        "JobId=5 JobName=train UserId=alice(1000) GroupId=alice(1000) JobState=RUNNING"
        f" NodeList=node1 JOB_GRES=gpu:1 Nodes=node1 CPU_IDs=0-1 Mem=0 GRES=gpu:1(IDX:{held})"
        f" MinCPUsNode=1 Features=(null) AdminComment={decision['set']['admin_comment']}"
    )
    body = {"show_job": show_job, "job_name": "train"}
    answer = k8s_client.post("/v1/slurm/job-started", json=body).json()
    assert (answer["action"], answer["superseded"]) == ("moved", [stale])
    assert watcher.since_last() == [("released", stale, "released"), ("moved", mine, "active")]


def test_a_sweep_expiry_publishes_one_event(
    k8s_client: TestClient, state: ServiceState, watcher: Watcher, clock: FakeClock
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "h0"))
    lapsing = k8s_client.post("/v1/place", json={"gpus": 2, "ttl_s": 30}).json()["id"]
    kept = k8s_client.post("/v1/place", json={"gpus": 2, "ttl_s": 300}).json()["id"]
    assert watcher.since_last() == [("placed", lapsing, "pending"), ("placed", kept, "pending")]
    clock.advance(31)
    assert api.sweep(state).ids == (lapsing,)  # what the background loop runs
    assert watcher.since_last() == [("expired", lapsing, "expired")]
    assert api.sweep(state).ids == ()
    assert watcher.since_last() == []


def _place_publishing_late(
    state: ServiceState, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, threading.Event, threading.Thread]:
    """A place committed whose ``placed`` waits to be published until the event is set:
    its allocation's id, the event, and the thread to join."""
    committed = threading.Event()
    released = threading.Event()
    publish = api._publish

    def late(state: ServiceState, type_: api.EventType, allocation: Allocation) -> None:
        if type_ == "placed":
            committed.set()
            assert released.wait(10)
        publish(state, type_, allocation)

    monkeypatch.setattr(api, "_publish", late)
    placing = threading.Thread(target=api.place, args=(state, PlaceRequest(gpus=2), None))
    placing.start()
    assert committed.wait(10)
    [allocation] = [a.id for a in api.live(state)]
    return allocation, released, placing


def test_a_release_published_before_its_place_leaves_the_watcher_at_released(
    k8s_client: TestClient, watcher: Watcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each change publishes after its own commit: a release committed and published
    while the place that made the allocation has yet to publish ``placed``. The late
    ``placed`` must not tell the watcher that a released allocation is pending again."""
    add_nodes(k8s_client, ("hgx-h100", "h0"))
    state: ServiceState = k8s_client.app.state.service  # type: ignore[attr-defined]
    watcher.since_last()
    allocation, released, placing = _place_publishing_late(state, monkeypatch)
    assert api.release(state, allocation).ids == (allocation,)
    released.set()
    placing.join(10)
    assert watcher.since_last(one_per_audit_row=False) == [("released", allocation, "released")]


def test_a_release_nobody_watched_still_outranks_a_late_place(
    k8s_client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with nobody watching when the release published (its event tallied,
    not built): a watcher that subscribes then, and lists, sees the allocation released;
    the late ``placed`` must not tell it the allocation is pending again."""
    add_nodes(k8s_client, ("hgx-h100", "h0"))
    state: ServiceState = k8s_client.app.state.service  # type: ignore[attr-defined]
    allocation, released, placing = _place_publishing_late(state, monkeypatch)
    assert api.release(state, allocation).ids == (allocation,)
    watcher = Watcher(state.events, state.engine)  # subscribes now, after the release
    try:
        assert api.get(state, allocation).state == "released"  # what it lists
        released.set()
        placing.join(10)
        assert watcher.since_last(one_per_audit_row=False) == []
    finally:
        released.set()
        watcher.close()


def test_calls_that_change_nothing_publish_nothing(
    k8s_client: TestClient, watcher: Watcher, clock: FakeClock
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "h0"))
    key = {"Idempotency-Key": "once"}
    first = k8s_client.post("/v1/place", json={"gpus": 2}, headers=key).json()["id"]
    lapsing = k8s_client.post("/v1/place", json={"gpus": 2, "ttl_s": 30}).json()["id"]
    watcher.since_last()
    assert k8s_client.post("/v1/place", json={"gpus": 2}, headers=key).status_code == 200
    assert watcher.since_last() == []  # a replay
    k8s_client.post(f"/v1/allocations/{first}/confirm")
    assert watcher.since_last() == [("confirmed", first, "active")]
    k8s_client.post(f"/v1/allocations/{first}/confirm")
    assert watcher.since_last() == []  # confirmed before: answered unchanged
    k8s_client.post(f"/v1/allocations/{first}/release")
    k8s_client.post(f"/v1/allocations/{first}/release")
    assert watcher.since_last() == [("released", first, "released")]
    # A confirm that finds the TTL passed expires the reservation: that change is told.
    clock.advance(31)
    assert k8s_client.post(f"/v1/allocations/{lapsing}/confirm").status_code == 409
    assert watcher.since_last() == [("expired", lapsing, "expired")]
