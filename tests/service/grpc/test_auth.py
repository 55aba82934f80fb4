"""Tokens over gRPC: the REST check on `authorization` metadata; health and reflection open."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.settings import Settings
from service.tokens import store
from tests.service.grpc.conftest import (
    UNPROBED,
    Running,
    block_writing,
    details,
    reason,
    snapshot_request,
    start,
)

ADMIN = "Bearer s3cret-0123456789abcdef"


@pytest.fixture
def guarded(tmp_path: Path) -> Iterator[Running]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'auth.sqlite3'}",
        api_tokens="s3cret-0123456789abcdef",
        insecure_dev=False,
    )
    yield from start(settings)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "requires a token"),
        ((("authorization", "Bearer wrong"),), "not one this service accepts"),
        ((("authorization", "Basic czNjcmV0"),), "must be 'Bearer TOKEN'"),
    ],
)
def test_a_missing_or_wrong_token_is_unauthenticated(
    guarded: Running, metadata: tuple[tuple[str, str], ...], message: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        guarded.stub.ListNodes(pb.ListNodesRequest(), metadata=metadata)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert message in caught.value.details()
    assert reason(caught.value) == "unauthorized"
    # A stream is refused the same way, before it starts.
    with pytest.raises(grpc.RpcError) as caught:
        next(guarded.stub.Watch(pb.WatchRequest(), metadata=metadata))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert details(caught.value)["ErrorInfo"].reason == "unauthorized"
    # Nothing ran: no allocation was made by a refused Place.
    with pytest.raises(grpc.RpcError):
        guarded.stub.Place(pb.PlaceRequest(gpus=1), metadata=metadata)
    assert guarded.rest.get(
        "/v1/allocations", headers={"Authorization": "Bearer s3cret-0123456789abcdef"}
    ).json() == {"allocations": []}


def test_the_right_token_is_accepted(guarded: Running) -> None:
    token = (("authorization", "Bearer s3cret-0123456789abcdef"),)
    assert not guarded.stub.ListNodes(pb.ListNodesRequest(), metadata=token).nodes
    stream = guarded.stub.Watch(pb.WatchRequest(), metadata=token)
    assert next(stream).type == "started"
    stream.cancel()


def test_health_and_reflection_stay_open(guarded: Running) -> None:
    health = health_pb2_grpc.HealthStub(guarded.channel)
    for service in ("", "topoplace.v1.Topoplace"):
        answer = health.Check(health_pb2.HealthCheckRequest(service=service))
        assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
    with pytest.raises(grpc.RpcError) as caught:
        health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND

    stub = reflection_pb2_grpc.ServerReflectionStub(guarded.channel)
    asks = [
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="topoplace.v1.Topoplace"),
    ]
    listed, described = list(stub.ServerReflectionInfo(iter(asks)))
    names = {s.name for s in listed.list_services_response.service}
    assert {"topoplace.v1.Topoplace", "grpc.health.v1.Health"} <= names
    files = described.file_descriptor_response.file_descriptor_proto
    assert files and b"topoplace/v1/topoplace.proto" in files[0]


def test_a_watch_ends_at_the_first_event_after_its_token_is_revoked(guarded: Running) -> None:
    admin = "Bearer s3cret-0123456789abcdef"
    made = guarded.rest.post(
        "/v1/tokens", json={"role": "viewer", "name": "dashboard"}, headers={"Authorization": admin}
    ).json()
    viewer = (("authorization", f"Bearer {made['token']}"),)
    stream = guarded.stub.Watch(pb.WatchRequest(), metadata=viewer, timeout=60)
    assert next(stream).type == "started"
    revoked = guarded.rest.delete(f"/v1/tokens/{made['id']}", headers={"Authorization": admin})
    assert revoked.status_code == 204
    guarded.stub.ReportSnapshot(
        snapshot_request("hgx-h100", "h0"), metadata=(("authorization", admin),)
    )
    # The node's report is not shown to a token revoked before it: the stream ends instead.
    with pytest.raises(grpc.RpcError) as caught:
        event = next(stream)
        pytest.fail(f"a revoked token's Watch was sent {event.kind}/{event.type}")
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert reason(caught.value) == "unauthorized"
    assert "revoked" in caught.value.details()


@pytest.mark.parametrize("where", ["this replica", "another replica"])
def test_a_quiet_watch_ends_soon_after_its_token_is_revoked(guarded: Running, where: str) -> None:
    """A stream ending only at its next event kept a revoked token's watch (and its slot
    under TOPOPLACE_MAX_WATCHES) open for as long as nothing happened in the cluster."""
    admin = "Bearer s3cret-0123456789abcdef"
    made = guarded.rest.post(
        "/v1/tokens", json={"role": "viewer", "name": "dashboard"}, headers={"Authorization": admin}
    ).json()
    viewer = (("authorization", f"Bearer {made['token']}"),)
    stream = guarded.stub.Watch(pb.WatchRequest(), metadata=viewer, timeout=15)
    assert next(stream).type == "started"
    hub = guarded.state.events
    assert hub.watched
    revoked_at = time.monotonic()
    if where == "this replica":
        answer = guarded.rest.delete(f"/v1/tokens/{made['id']}", headers={"Authorization": admin})
        assert answer.status_code == 204
    else:  # as another replica sharing the database revokes it: this process is not told
        assert store.revoke(guarded.state.engine, made["id"]) is not None
    # No event follows: the stream must end on its own, not at its 15 s deadline.
    with pytest.raises(grpc.RpcError) as caught:
        event = next(stream)
        pytest.fail(f"a revoked token's Watch was sent {event.kind}/{event.type}")
    took = time.monotonic() - revoked_at
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value.details()
    assert reason(caught.value) == "unauthorized"
    assert "revoked" in caught.value.details()
    assert took < 5, f"the stream ended {took:.1f} s after its token was revoked"
    deadline = time.monotonic() + 5
    while hub.watched and time.monotonic() < deadline:
        time.sleep(0.02)  # the stream leaves the hub on the server's loop
    assert not hub.watched, "the revoked token's watch still holds its slot"


@pytest.fixture
def guarded_on(settings: Settings) -> Iterator[Running]:
    """``guarded`` on each test database."""
    yield from start(settings.model_copy(update={"insecure_dev": False, "api_tokens": ADMIN[7:]}))


def test_a_token_that_cannot_be_looked_up_is_unavailable(
    guarded_on: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As REST's 503: UNAVAILABLE with database_unavailable and RetryInfo, not UNKNOWN
    with the database driver's words."""
    made = guarded_on.rest.post(
        "/v1/tokens", json={"role": "viewer", "name": "v"}, headers={"Authorization": ADMIN}
    ).json()

    def unreachable(*_: object) -> None:
        raise sa.exc.OperationalError("SELECT secret", {}, Exception("connection refused"))

    monkeypatch.setattr(store, "live_token", unreachable)
    viewer = (("authorization", f"Bearer {made['token']}"),)
    stub = guarded_on.stub
    for call in (
        lambda: stub.ListNodes(pb.ListNodesRequest(), metadata=viewer),
        lambda: next(stub.Watch(pb.WatchRequest(), metadata=viewer, timeout=10)),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE, caught.value.details()
        assert reason(caught.value) == "database_unavailable"
        assert details(caught.value)["RetryInfo"].retry_delay.seconds == 5
        assert "SELECT" not in caught.value.details()
        # Nor the driver's words, which name the database's host and user.
        assert "connection refused" not in caught.value.details()


@pytest.fixture
def few_watches(tmp_path: Path) -> Iterator[Running]:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'watches.sqlite3'}",
        api_tokens=ADMIN[7:],
        insecure_dev=False,
        max_watches=3,
        max_watches_per_caller=2,
    )
    yield from start(settings)


def test_watches_are_bounded_per_token_and_in_all(few_watches: Running) -> None:
    """Every open Watch is handed every event, on the writers' path: a viewer token that
    opened watches without end slowed every /place and grew memory by a buffer each."""
    admin = (("authorization", ADMIN),)

    def viewer(name: str) -> tuple[tuple[str, str], ...]:
        made = few_watches.rest.post(
            "/v1/tokens", json={"role": "viewer", "name": name}, headers={"Authorization": ADMIN}
        ).json()
        return (("authorization", f"Bearer {made['token']}"),)

    first, second = viewer("first"), viewer("second")

    def watch(metadata: tuple[tuple[str, str], ...]) -> Any:
        stream = few_watches.stub.Watch(pb.WatchRequest(), metadata=metadata, timeout=60)
        assert next(stream).type == "started"
        return stream

    def refused(metadata: tuple[tuple[str, str], ...], limit: int) -> None:
        with pytest.raises(grpc.RpcError) as caught:
            watch(metadata)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason(caught.value) == "too_many_watches"
        assert str(limit) in caught.value.details()

    a1, a2 = watch(first), watch(first)
    refused(first, 2)  # this token's own bound
    b1 = watch(second)
    refused(second, 3)  # every caller's together
    a1.cancel()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            b2 = watch(second)
            break
        except grpc.RpcError:
            time.sleep(0.05)  # the cancelled watch leaves the hub on the server's loop
    else:
        pytest.fail("a cancelled watch still counted against the bound")
    few_watches.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"), metadata=admin)
    for stream in (a2, b1, b2):
        assert next(stream).type == "reported"
        stream.cancel()


def test_a_watch_whose_client_stopped_reading_ends_when_its_token_is_revoked(
    guarded: Running, caplog: pytest.LogCaptureFixture
) -> None:
    """A stream blocked writing to a client that reads nothing (its flow-control window
    full) never came back to its revocation check: on a quiet cluster it kept the revoked
    token's watch, and its slot under TOPOPLACE_MAX_WATCHES, for good."""
    admin = "Bearer s3cret-0123456789abcdef"
    made = guarded.rest.post(
        "/v1/tokens", json={"role": "viewer", "name": "dashboard"}, headers={"Authorization": admin}
    ).json()
    viewer = (("authorization", f"Bearer {made['token']}"),)
    hub = guarded.state.events
    with grpc.insecure_channel(f"127.0.0.1:{guarded.server.port}", options=UNPROBED) as channel:
        stream = pb_grpc.TopoplaceStub(channel).Watch(
            pb.WatchRequest(), metadata=viewer, timeout=30
        )
        assert next(stream).type == "started"
        (subscription,) = hub._subscriptions
        # Not ended for falling behind: the events fit the watcher's buffer.
        block_writing(guarded, subscription)
        assert store.revoke(guarded.state.engine, made["id"]) is not None
        deadline = time.monotonic() + 5
        while hub.watched and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not hub.watched, "the revoked token's blocked watch still holds its slot"
        # What was sent before the revocation may still be read; then the stream ends.
        with pytest.raises(grpc.RpcError) as caught:
            for _ in stream:
                pass
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value.details()
        assert "revoked" in (caught.value.details() or "")
    # Its generators closed cleanly, though not on the server's task that ran them.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
