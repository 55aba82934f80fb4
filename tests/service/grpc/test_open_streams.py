"""The open streams (health Watch, server reflection) are bounded, per peer and in all.

They need no token, and each held a call, its HTTP/2 stream and a task for as
long as the client kept it open (1,000 health Watches on one channel: about
50 MiB): a client with no token could grow the service's memory without end.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from service.settings import Settings
from tests.service.conftest import secured
from tests.service.grpc.conftest import Running, details, reason, start


def _bounded(settings: Settings, total: int, per_peer: int) -> Iterator[Running]:
    yield from start(
        secured(settings).model_copy(
            update={"max_open_streams": total, "max_open_streams_per_peer": per_peer}
        )
    )


@pytest.fixture
def few_per_peer(settings: Settings) -> Iterator[Running]:
    yield from _bounded(settings, total=10, per_peer=2)


@pytest.fixture
def few_in_all(settings: Settings) -> Iterator[Running]:
    yield from _bounded(settings, total=3, per_peer=10)


def _health_watch(running: Running) -> Any:
    health: Any = health_pb2_grpc.HealthStub(running.channel)
    stream = health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
    assert next(stream).status == health_pb2.HealthCheckResponse.SERVING
    return stream


def _reflection(running: Running) -> Any:
    """A reflection stream left open after its first answer (its requests never end)."""
    stub: Any = reflection_pb2_grpc.ServerReflectionStub(running.channel)

    def requests() -> Iterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        time.sleep(60)  # the client keeps the stream open

    stream = stub.ServerReflectionInfo(requests(), timeout=60)
    assert next(stream).list_services_response.service
    return stream


def _refused(open_one: Callable[[], Any], scope: str, limit: int) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        open_one()
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(caught.value) == "too_many_streams"
    assert f"{limit} open" in str(caught.value.details())
    metadata = details(caught.value)["ErrorInfo"].metadata  # type: ignore[attr-defined]
    assert metadata["scope"] == scope and metadata["limit"] == str(limit)


def _eventually(open_one: Callable[[], Any]) -> Any:
    """``open_one`` once the server has seen an ended stream go (it learns of it soon)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return open_one()
        except grpc.RpcError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_one_peer_holds_a_bounded_number_of_open_streams(few_per_peer: Running) -> None:
    first, second = _health_watch(few_per_peer), _reflection(few_per_peer)
    _refused(lambda: _health_watch(few_per_peer), "peer", 2)
    _refused(lambda: _reflection(few_per_peer), "peer", 2)
    # The unary health check is no stream: never refused.
    health: Any = health_pb2_grpc.HealthStub(few_per_peer.channel)
    check = health.Check(health_pb2.HealthCheckRequest(service=""))
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    first.cancel()  # an ended stream gives its slot back
    third = _eventually(lambda: _health_watch(few_per_peer))
    for stream in (second, third):
        stream.cancel()


def test_the_service_serves_a_bounded_number_of_open_streams(few_in_all: Running) -> None:
    streams = [_health_watch(few_in_all), _health_watch(few_in_all), _reflection(few_in_all)]
    _refused(lambda: _health_watch(few_in_all), "service", 3)
    streams[0].cancel()
    streams[0] = _eventually(lambda: _reflection(few_in_all))
    for stream in streams:
        stream.cancel()
