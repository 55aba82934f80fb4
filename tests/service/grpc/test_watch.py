"""The Watch stream: allocation and node events from either transport, in order, bounded."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.allocations import api
from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.notify import CHANNEL
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.grpc.conftest import (
    UNPROBED,
    Running,
    block_writing,
    details,
    snapshot_request,
    start,
)


def _kinds(events: list[pb.Event]) -> list[tuple[str, str]]:
    return [(e.kind, e.type) for e in events]


def test_watch_sees_every_change_from_both_transports(running: Running, clock: FakeClock) -> None:
    stream = running.stub.Watch(pb.WatchRequest(), timeout=60)
    started = next(stream)
    assert (started.kind, started.type) == ("watch", "started")

    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    running.stub.Heartbeat(pb.HeartbeatRequest(node="h0"))  # not an event
    lapsing = running.stub.Place(pb.PlaceRequest(gpus=2, ttl_s=30, job_id="lapse"))
    kept = running.rest.post("/v1/place", json={"gpus": 1, "job_id": "keep"}).json()
    running.stub.ConfirmAllocation(pb.ConfirmAllocationRequest(id=kept["id"]))
    running.stub.ExtendAllocation(pb.ExtendAllocationRequest(id=lapsing.id, ttl_s=40))
    running.rest.post("/v1/nodes/h0/cordon")
    running.rest.post("/v1/nodes/h0/uncordon")
    clock.advance(100)
    assert api.sweep(running.state).ids == (lapsing.id,)  # what the background sweep runs
    running.rest.post(f"/v1/allocations/{kept['id']}/release")

    events = [next(stream) for _ in range(9)]
    assert _kinds(events) == [
        ("node", "reported"),
        ("allocation", "placed"),
        ("allocation", "placed"),
        ("allocation", "confirmed"),
        ("allocation", "extended"),
        ("node", "cordoned"),
        ("node", "uncordoned"),
        ("allocation", "expired"),
        ("allocation", "released"),
    ]
    assert [e.seq for e in events] == list(range(started.seq + 1, started.seq + 10))
    assert events[0].node == "h0" and events[5].node == "h0"
    assert events[1].allocation == lapsing
    assert events[2].allocation.id == kept["id"] and events[2].allocation.state == "pending"
    assert events[3].allocation.state == "active"
    assert (events[7].allocation.id, events[7].allocation.state) == (lapsing.id, "expired")
    assert (events[8].allocation.id, events[8].allocation.state) == (kept["id"], "released")
    stream.cancel()
    deadline = time.monotonic() + 10
    while running.state.events.watched and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running.state.events.watched, "a cancelled watcher must leave the hub"


def test_watch_filters_by_kind(running: Running) -> None:
    stream = running.stub.Watch(pb.WatchRequest(kinds=["node"]), timeout=60)
    next(stream)
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    running.stub.Place(pb.PlaceRequest(gpus=1))
    running.rest.post("/v1/nodes/h0/cordon")
    assert _kinds([next(stream), next(stream)]) == [("node", "reported"), ("node", "cordoned")]
    stream.cancel()

    with pytest.raises(grpc.RpcError) as caught:
        next(running.stub.Watch(pb.WatchRequest(kinds=["gpus"])))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(caught.value)["BadRequest"].field_violations[0].field == "kinds"


def test_a_watcher_that_falls_behind_is_ended_not_buffered_forever(running: Running) -> None:
    hub = running.state.events
    hub.buffer = 3
    stream = running.stub.Watch(pb.WatchRequest(), timeout=60)
    next(stream)
    loop = running.server.loop
    assert loop is not None
    # Ten events handed over in one turn of the server's loop, before the
    # stream can take any: more than the watcher's buffer of three.
    loop.call_soon_threadsafe(lambda: hub.nodes("reported", [f"n{i}" for i in range(10)]))
    with pytest.raises(grpc.RpcError) as caught:
        for _ in stream:
            pass
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details(caught.value)["ErrorInfo"].reason == "watch_overflow"
    assert not hub.watched


def test_changes_made_by_another_replica_are_node_events(running: Running) -> None:
    if running.state.settings.is_sqlite:
        pytest.skip("replicas share Postgres; an embedded SQLite service is one process")
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    stream = running.stub.Watch(pb.WatchRequest(kinds=["node"]), timeout=60)
    next(stream)
    stop = threading.Event()

    def notify_until_seen() -> None:
        # As another replica's commit would: the listener may still be connecting.
        body = json.dumps({"origin": "another-replica", "nodes": ["h0"]})
        with running.state.engine.connect() as conn:
            while not stop.is_set():
                conn.execute(sa.text("SELECT pg_notify(:c, :b)"), {"c": CHANNEL, "b": body})
                conn.commit()
                stop.wait(0.5)

    thread = threading.Thread(target=notify_until_seen)
    thread.start()
    try:
        event = next(stream)
    finally:
        stop.set()
        thread.join()
    assert (event.kind, event.type, event.node) == ("node", "changed", "h0")
    stream.cancel()


def test_watch_streams_end_when_the_server_stops(settings, clock: FakeClock) -> None:
    app = create_app(settings.model_copy(update={"grpc_port": 0}), clock=clock, background=False)
    with TestClient(app):
        channel = grpc.insecure_channel(f"127.0.0.1:{app.state.grpc.port}")
        stream = pb_grpc.TopoplaceStub(channel).Watch(pb.WatchRequest(), timeout=60)
        next(stream)
        began = time.monotonic()
    # Leaving the app ran the lifespan's shutdown, which stopped the gRPC server.
    with channel:
        assert list(stream) == []  # ended cleanly, without an error
    assert time.monotonic() - began < 4, "a watcher must not hold the shutdown for its grace"


@pytest.fixture
def one_watch(settings: Settings, clock: FakeClock) -> Iterator[Running]:
    # --insecure-dev: every call is the one caller without a token
    yield from start(settings.model_copy(update={"max_watches_per_caller": 1}), clock)


def test_a_watch_that_fell_behind_counts_until_its_call_ends(one_watch: Running) -> None:
    """A Watch blocked sending to a client that reads nothing (its flow-control window
    full) left the hub when it fell behind, and its slot with it, while its call stayed
    open, blocked on the write for as long as the connection lived: a token bounded to
    one watch held as many stalled streams as it opened (each a call, three tasks and
    the events in flight). Now it counts against the bounds until its call ends."""
    hub = one_watch.state.events
    loop = one_watch.server.loop
    assert loop is not None
    with grpc.insecure_channel(f"127.0.0.1:{one_watch.server.port}", options=UNPROBED) as channel:
        stalled = pb_grpc.TopoplaceStub(channel).Watch(pb.WatchRequest(kinds=["node"]), timeout=60)
        assert next(stalled).type == "started"
        (subscription,) = hub._subscriptions
        block_writing(one_watch, subscription)
        # Then more than the buffer holds: the watcher has fallen behind.
        more = [f"m{i}" for i in range(hub.buffer + 1)]
        loop.call_soon_threadsafe(lambda: hub.nodes("reported", more))
        deadline = time.monotonic() + 5
        while not subscription.overflowed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert subscription.overflowed and not subscription._buffer
        assert not hub.watched  # handed no more events
        # Its call is still open, so it still holds the caller's one watch.
        with pytest.raises(grpc.RpcError) as caught:
            next(one_watch.stub.Watch(pb.WatchRequest(), timeout=10))
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details(caught.value)["ErrorInfo"].reason == "too_many_watches"
        # Read, it ends as a watcher that fell behind ends, and gives its slot back.
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stalled:
                pass
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert details(caught.value)["ErrorInfo"].reason == "watch_overflow"
    deadline = time.monotonic() + 10
    while True:
        try:
            fresh = one_watch.stub.Watch(pb.WatchRequest(), timeout=10)
            assert next(fresh).type == "started"
            break
        except grpc.RpcError:
            assert time.monotonic() < deadline, "the ended watch still holds its slot"
            time.sleep(0.05)  # the ended call leaves the hub on the server's loop
    fresh.cancel()
