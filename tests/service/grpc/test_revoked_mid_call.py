"""A gRPC call whose token is revoked while it is in flight writes nothing.

The interceptor checks the token when the call's headers arrive; its request
message may come seconds later, and the method may then wait on the state
lock. A proxy on loopback holds the calls' DATA frames (their messages) until
the token is revoked, as a slow client would; before, the write landed after
the revocation had committed (service/edge/revoked_meanwhile.py).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.settings import Settings
from service.tokens import store
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.grpc.conftest import Running, reason, snapshot_request, start

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
STATIC_ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
PREFACE_BYTES = 24
DATA = 0


@pytest.fixture
def guarded(settings: Settings) -> Iterator[Running]:
    yield from start(secured(settings))


class HeldMessages:
    """A loopback proxy in front of the gRPC port: it forwards what a client sends frame
    by frame, but stops at the first DATA frame of a call (its request message) until
    :meth:`release`, as a client sending its message slowly would."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.released = threading.Event()
        self.held = threading.Event()  # a message is being held
        self._sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self._sockets += [client, upstream]
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
            threading.Thread(target=self._frames, args=(client, upstream), daemon=True).start()

    def _frames(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            upstream.sendall(_exactly(client, PREFACE_BYTES))
            while True:
                head = _exactly(client, 9)
                frame = head + _exactly(client, int.from_bytes(head[:3], "big"))
                stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                if head[3] == DATA and stream and not self.released.is_set():
                    self.held.set()
                    self.released.wait(30)
                upstream.sendall(frame)
        except OSError:
            return


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return data


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        return


@contextlib.contextmanager
def holding(running: Running) -> Iterator[tuple[HeldMessages, pb_grpc.TopoplaceStub]]:
    """A client whose calls' messages wait at a proxy of their own (one connection: a
    held message holds back the calls behind it)."""
    proxy = HeldMessages(running.server.port)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{proxy.port}") as channel:
            yield proxy, pb_grpc.TopoplaceStub(channel)
    finally:
        proxy.close()


@pytest.fixture
def held(guarded: Running) -> Iterator[tuple[HeldMessages, pb_grpc.TopoplaceStub]]:
    with holding(guarded) as client:
        yield client


def _token(running: Running, role: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    made = running.rest.post("/v1/tokens", json={"role": role, "name": role}, headers=ADMIN)
    assert made.status_code == 201, made.text
    metadata = (("authorization", f"Bearer {made.json()['token']}"),)
    running.stub.ListNodes(pb.ListNodesRequest(), metadata=metadata)  # verified and cached
    return made.json()["id"], metadata


def _revoke(running: Running, token_id: str) -> None:
    assert running.rest.delete(f"/v1/tokens/{token_id}", headers=ADMIN).status_code == 204


def _allocations(running: Running) -> list[pb.Allocation]:
    listed = running.stub.ListAllocations(pb.ListAllocationsRequest(), metadata=STATIC_ADMIN)
    return list(listed.allocations)


def _refused(call: grpc.Future) -> None:  # type: ignore[type-arg]
    with pytest.raises(grpc.RpcError) as caught:
        call.result(timeout=10)
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED, caught.value.details()
    assert reason(caught.value) == "unauthorized"
    assert "revoked while this request was in flight" in caught.value.details()


def _report(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("dgx-a100", "n1"), metadata=STATIC_ADMIN)


def _in_flight(held: HeldMessages, send: Callable[[], Any]) -> Any:
    """The call ``send`` starts, once its message is held at the proxy."""
    call = send()
    assert held.held.wait(5), "the call's message never reached the proxy"
    time.sleep(0.1)  # its headers reached the service ahead of it: the token is checked
    return call


def test_a_place_whose_token_is_revoked_before_its_message_arrives_reserves_nothing(
    guarded: Running, held: tuple[HeldMessages, pb_grpc.TopoplaceStub]
) -> None:
    proxy, stub = held
    _report(guarded)
    token_id, scheduler = _token(guarded, "scheduler")
    request = pb.PlaceRequest(gpus=2, job_id="slow-job")
    call = _in_flight(proxy, lambda: stub.Place.future(request, metadata=scheduler))
    _revoke(guarded, token_id)
    proxy.release()
    _refused(call)
    assert _allocations(guarded) == []


def test_a_place_whose_message_arrives_before_a_revocation_reserves(
    guarded: Running, held: tuple[HeldMessages, pb_grpc.TopoplaceStub]
) -> None:
    """The control: held the same way, with its token live."""
    proxy, stub = held
    _report(guarded)
    _, scheduler = _token(guarded, "scheduler")
    request = pb.PlaceRequest(gpus=2, job_id="slow-job")
    call = _in_flight(proxy, lambda: stub.Place.future(request, metadata=scheduler))
    proxy.release()
    assert call.result(timeout=10).job_id == "slow-job"


def test_a_snapshot_and_a_release_whose_token_is_revoked_in_flight_change_nothing(
    guarded: Running, held: tuple[HeldMessages, pb_grpc.TopoplaceStub]
) -> None:
    """An admin token's report of a new node; a scheduler's release."""
    proxy, stub = held
    _report(guarded)
    placed = guarded.stub.Place(pb.PlaceRequest(gpus=2), metadata=STATIC_ADMIN)
    admin_id, admin = _token(guarded, "admin")
    scheduler_id, scheduler = _token(guarded, "scheduler")
    snapshot = snapshot_request("dgx-a100", "n2")
    reporting = _in_flight(proxy, lambda: stub.ReportSnapshot.future(snapshot, metadata=admin))
    with holding(guarded) as (second_proxy, second_stub):
        release = pb.ReleaseAllocationRequest(id=placed.id)
        releasing = _in_flight(
            second_proxy, lambda: second_stub.ReleaseAllocation.future(release, metadata=scheduler)
        )
        _revoke(guarded, admin_id)
        _revoke(guarded, scheduler_id)
        proxy.release()
        second_proxy.release()
        _refused(reporting)
        _refused(releasing)
    nodes = guarded.stub.ListNodes(pb.ListNodesRequest(), metadata=STATIC_ADMIN).nodes
    assert [n.name for n in nodes] == ["n1"]
    [still] = _allocations(guarded)
    assert still.id == placed.id and still.state == "pending"


@pytest.mark.parametrize("where", ["this replica", "another replica"])
def test_a_place_that_waits_on_the_state_lock_while_its_token_is_revoked_reserves_nothing(
    guarded: Running, where: str
) -> None:
    """Its message had arrived: the call waits on the lock (held here) when the token is
    revoked, through this process or as another replica revokes it (heard by the poll)."""
    _report(guarded)
    token_id, scheduler = _token(guarded, "scheduler")
    with guarded.state.lock:
        call = guarded.stub.Place.future(pb.PlaceRequest(gpus=2), metadata=scheduler)
        time.sleep(0.3)  # the call runs on a worker thread, which waits on the lock
        if where == "this replica":
            _revoke(guarded, token_id)
        else:  # the database says so; this process hears of it within its poll
            assert store.revoke(guarded.state.engine, token_id) is not None
            check = guarded.rest.app.state.token_check  # type: ignore[attr-defined]
            deadline = time.monotonic() + 2
            while not check.revoked_id(token_id):
                assert time.monotonic() < deadline, "the revocation was never heard of"
                time.sleep(0.02)
    _refused(call)
    assert _allocations(guarded) == []
