"""A running service with its gRPC API on a free loopback port, and a real grpcio client."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from service.app import create_app
from service.events import Subscription
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.grpc.server import GrpcServer
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock


@dataclass
class Running:
    rest: TestClient
    channel: grpc.Channel
    stub: pb_grpc.TopoplaceStub
    state: ServiceState
    server: GrpcServer


def start(settings: Settings, clock: FakeClock | None = None) -> Iterator[Running]:
    settings = settings.model_copy(update={"grpc_port": 0})
    kwargs: dict[str, Any] = {"background": False}
    if clock is not None:
        kwargs["clock"] = clock
    app = create_app(settings, **kwargs)
    with TestClient(app) as rest:
        server = app.state.grpc
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = pb_grpc.TopoplaceStub(channel)
            yield Running(rest, channel, stub, app.state.service, server)


@pytest.fixture
def running(settings: Settings, clock: FakeClock) -> Iterator[Running]:
    yield from start(settings, clock)


def snapshot_request(profile: str, name: str, seq: int = 1) -> pb.ReportSnapshotRequest:
    from placement.profiles import build_profile

    snap = build_profile(profile, name).model_copy(update={"seq": seq})
    return pb.ReportSnapshotRequest(node=name, snapshot_json=snap.model_dump_json())


def details(error: grpc.RpcError) -> dict[str, Message]:
    """The status details of a failed call, by message type name."""
    status = rpc_status.from_call(error)
    assert status is not None, "no grpc-status-details-bin trailer"
    out: dict[str, Message] = {}
    kinds: list[type[Message]] = [
        error_details_pb2.ErrorInfo,
        error_details_pb2.RetryInfo,
        error_details_pb2.BadRequest,
        pb.PlacementRefusal,
        pb.Allocation,
    ]
    for packed in status.details:
        for kind in kinds:
            if packed.Is(kind.DESCRIPTOR):
                message = kind()
                packed.Unpack(message)
                out[kind.DESCRIPTOR.name] = message
    return out


def reason(error: grpc.RpcError) -> str:
    info = details(error)["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.domain == "topoplace"
    return info.reason


# No BDP probing: a client's window stays at its initial size while it reads nothing.
UNPROBED = [("grpc.http2.bdp_probe", 0)]


def block_writing(running: Running, subscription: Subscription) -> None:
    """Publish 200 events of some 8 KiB each (far more than an UNPROBED client's window
    holds, fewer than a watcher buffers) and wait until ``subscription``'s stream is
    blocked writing, events left in its buffer."""
    hub = running.state.events
    loop = running.server.loop
    assert loop is not None
    names = [f"n{i}-" + "x" * 8192 for i in range(200)]
    loop.call_soon_threadsafe(lambda: hub.nodes("reported", names))
    deadline = time.monotonic() + 5
    while len(subscription._buffer) < 100 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert subscription._buffer, "the stream is not blocked writing"
