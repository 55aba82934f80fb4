"""Slow and idle gRPC clients are held to REST's deadlines (docs/security.md, "Limits").

A hostile client speaks HTTP/2 by hand: it opens connections and leaves them
idle, or starts calls whose request message never completes. REST closes an
idle kept-alive connection after TOPOPLACE_KEEP_ALIVE_TIMEOUT_S and ends a
body that has not arrived within TOPOPLACE_BODY_TIMEOUT_S; gRPC held both for
good (each stalled call keeping its partial message, tens of KiB, in memory,
any number of them on one connection).
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import grpc
import pytest

from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from tests.service.conftest import secured
from tests.service.grpc.conftest import Running, details, reason, snapshot_request, start

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0, 1, 3, 4, 7
END_STREAM, END_HEADERS = 0x1, 0x4


@pytest.fixture
def impatient(settings: Settings) -> Iterator[Running]:
    quick = secured(settings).model_copy(update={"body_timeout_s": 0.5, "keep_alive_timeout_s": 1})
    yield from start(quick)


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream)
    return head + payload


def _header(name: str, value: str) -> bytes:
    """One HPACK literal header field, not indexed, with a literal name (both short)."""
    return b"\x00" + bytes([len(name)]) + name.encode() + bytes([len(value)]) + value.encode()


def _connect(running: Running) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", running.server.port))
    sock.sendall(PREFACE + _frame(SETTINGS, 0, 0))
    return sock


def _stall(sock: socket.socket, stream: int) -> None:
    """A ListNodes call whose message declares 1000 bytes and sends one, then nothing."""
    block = b"".join(
        _header(name, value)
        for name, value in (
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/topoplace.v1.Topoplace/ListNodes"),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        )
    )
    message = b"\x00" + struct.pack(">I", 1000) + b"x"
    sock.sendall(_frame(HEADERS, END_HEADERS, stream, block) + _frame(DATA, 0, stream, message))


def _frames(sock: socket.socket, wait_s: float) -> tuple[list[tuple[int, int, int]], bool]:
    """The (type, flags, stream) of the frames the server sent within ``wait_s``, and
    whether it closed the connection."""
    sock.settimeout(0.1)
    received = b""
    closed = False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not closed:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            closed = True
            break
        closed = not chunk
        received += chunk
    frames = []
    while len(received) >= 9:
        length = int.from_bytes(received[:3], "big")
        stream = int.from_bytes(received[5:9], "big") & 0x7FFFFFFF
        frames.append((received[3], received[4], stream))
        received = received[9 + length :]
    return frames, closed


def _ended(frames: list[tuple[int, int, int]], stream: int) -> bool:
    """Whether the server ended ``stream``: its trailers, or a reset."""
    return any(
        s == stream and (kind == RST_STREAM or (kind == HEADERS and flags & END_STREAM))
        for kind, flags, s in frames
    )


def test_a_request_message_that_never_completes_is_ended_at_the_body_deadline(
    impatient: Running,
) -> None:
    sock = _connect(impatient)
    with sock:
        streams = [1, 3, 5]
        for stream in streams:
            _stall(sock, stream)
        frames, _ = _frames(sock, 2.0)
    assert all(_ended(frames, stream) for stream in streams), frames


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(impatient: Running) -> None:
    sock = _connect(impatient)
    with sock:
        frames, closed = _frames(sock, 3.0)
    assert closed, frames
    assert any(kind == GOAWAY for kind, _, _ in frames)


def test_prompt_calls_and_an_open_watch_outlive_both_deadlines(impatient: Running) -> None:
    metadata = (("authorization", "Bearer test-admin-token-0123456789abcdef"),)
    stub = impatient.stub
    events = stub.Watch(pb.WatchRequest(kinds=["node"]), metadata=metadata)
    assert next(events).type == "started"
    time.sleep(2.0)  # past the keep-alive timeout: the open watch keeps its connection
    stub.ReportSnapshot(snapshot_request("dgx-a100", "n1"), metadata=metadata)
    assert next(events).type == "reported"
    events.cancel()
    time.sleep(2.0)  # the channel's connection was closed idle: the next call opens one
    assert [n.name for n in stub.ListNodes(pb.ListNodesRequest(), metadata=metadata).nodes] == [
        "n1"
    ]


def test_a_message_that_does_not_parse_is_a_bad_request(running: Running) -> None:
    # A string field that is no UTF-8 (or any message protobuf cannot read) ended the call
    # with UNKNOWN "Unexpected DecodeError" and no ErrorInfo; REST answers a body it
    # cannot parse 400 bad_request.
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    job_id = bytes([0x8A, 0x01, 0x02, 0xFF, 0xFE])  # field 17 (job_id), 2 bytes, not UTF-8
    raw = pb.PlaceRequest(gpus=1).SerializeToString() + job_id
    place = running.channel.unary_unary(
        "/topoplace.v1.Topoplace/Place",
        request_serializer=lambda b: b,
        response_deserializer=pb.Allocation.FromString,
    )
    with pytest.raises(grpc.RpcError) as caught:
        place(raw)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "bad_request"
    assert "ErrorInfo" in details(error)
    rest = running.rest.post(
        "/v1/place",
        content=b'{"gpus": 1, "job_id": "\xff\xfe"}',
        headers={"content-type": "application/json"},
    )
    assert rest.status_code == 400 and rest.json()["error"]["code"] == "bad_request"
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []
