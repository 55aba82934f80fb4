"""One Idempotency-Key, one reservation, whichever API carries the retry."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from placement.profiles import build_profile
from service.allocations import api as allocations
from service.grpc import convert
from service.grpc.gen import topoplace_pb2 as pb
from tests.service.grpc.conftest import Running, details, reason

LABELS = {"zone": "a", "rack": "r1", "pool": "train", "tier": "gold"}


def _labelled_node(running: Running) -> None:
    snap = build_profile("hgx-h100", "h0").model_copy(update={"labels": LABELS})
    request = pb.ReportSnapshotRequest(node="h0", snapshot_json=snap.model_dump_json())
    running.stub.ReportSnapshot(request)


def test_a_rest_reservation_is_replayed_over_grpc_whatever_the_labels_order(
    running: Running,
) -> None:
    _labelled_node(running)
    message = pb.PlaceRequest(gpus=2, node_labels=LABELS, job_id="j")
    # The order gRPC gives the labels in this process, reversed: the REST body a client
    # may as well have sent (JSON objects and protobuf maps have no order).
    parsed = pb.PlaceRequest.FromString(message.SerializeToString())
    order = list(convert.request_fields(parsed)["node_labels"])[::-1]
    body = {"gpus": 2, "job_id": "j", "node_labels": {k: LABELS[k] for k in order}}
    first = running.rest.post("/v1/place", json=body, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201, first.text
    with pytest.raises(grpc.RpcError) as replayed:
        running.stub.Place(message, metadata=(("idempotency-key", "k-1"),))
    assert replayed.value.code() == grpc.StatusCode.ALREADY_EXISTS, replayed.value.details()
    assert reason(replayed.value) == "idempotent_replay"
    assert details(replayed.value)["Allocation"].id == first.json()["id"]
    listed = running.stub.ListAllocations(pb.ListAllocationsRequest())
    assert [a.id for a in listed.allocations] == [first.json()["id"]]


def test_a_place_cut_off_by_its_deadline_is_found_again_by_its_key(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that ends before its answer (a deadline, a cancel) may have reserved: as on
    REST, where a client that hung up left its reservation made, the key finds it, and a
    retry under it never makes a second one."""
    _labelled_node(running)
    started, finish = threading.Event(), threading.Event()
    place = allocations.place

    def slow(*args: Any, **kwargs: Any) -> Any:
        started.set()
        finish.wait(10)
        return place(*args, **kwargs)

    monkeypatch.setattr(allocations, "place", slow)
    key = (("idempotency-key", "cut-off"),)
    request = pb.PlaceRequest(gpus=2, job_id="cut")
    with pytest.raises(grpc.RpcError) as cut:
        running.stub.Place(request, metadata=key, timeout=0.5)
    assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert started.is_set()
    finish.set()
    found = None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the first call's reservation, committed after it
        try:
            # The first call, let go, and the retry commit side by side: whichever commits
            # first holds the key, and the other is answered with its allocation. A retry
            # answered as new is right only when it is then the key's one reservation.
            found = running.stub.Place(request, metadata=key, timeout=10)
            break
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.ALREADY_EXISTS:
                found = details(error)["Allocation"]
                break
            assert error.code() == grpc.StatusCode.ABORTED, error.details()  # in flight
        time.sleep(0.05)
    assert found is not None, "the cut-off call's reservation was never found"
    listed = running.stub.ListAllocations(pb.ListAllocationsRequest(job_id="cut"))
    assert [a.id for a in listed.allocations] == [found.id]


def test_a_gang_replay_too_large_for_the_trailer_still_names_its_allocation(
    running: Running,
) -> None:
    # The replay put the whole Allocation into the status trailer. A gang of 64 tasks made
    # 23 KB of trailer, past what a gRPC client takes (16 KiB, refused at random past
    # 8 KiB): the client got RESOURCE_EXHAUSTED "Stream removed" and no details, so it
    # could not learn its reservation and a retry policy kept asking.
    for i in range(8):
        snap = build_profile("hgx-h100", f"h{i}")
        running.stub.ReportSnapshot(
            pb.ReportSnapshotRequest(node=snap.name, snapshot_json=snap.model_dump_json())
        )
    key = (("idempotency-key", "gang-64"),)
    request = pb.PlaceRequest(gpus=1, tasks=64, cpus_per_task=2, job_id="gang")
    first = running.stub.Place(request, metadata=key)
    with pytest.raises(grpc.RpcError) as replayed:
        running.stub.Place(request, metadata=key)
    error = replayed.value
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS, error.details()
    assert reason(error) == "idempotent_replay"
    info = details(error)["ErrorInfo"]
    assert isinstance(info, error_details_pb2.ErrorInfo)
    assert info.metadata["allocation_id"] == first.id
    assert "GetAllocation" in str(error.details())
    fetched = running.stub.GetAllocation(pb.GetAllocationRequest(id=first.id))
    assert fetched == first
    listed = running.stub.ListAllocations(pb.ListAllocationsRequest(job_id="gang"))
    assert [a.id for a in listed.allocations] == [first.id]


def test_a_key_with_surrounding_spaces_is_the_key_rest_reads(running: Running) -> None:
    # An HTTP server takes the spaces and tabs around a header's value off (RFC 9110,
    # uvicorn does), so REST stored "key-1" for "Idempotency-Key: key-1 "; gRPC kept
    # " key-1 ", and the same key sent over both transports made two reservations.
    _labelled_node(running)
    first = running.rest.post("/v1/place", json={"gpus": 2}, headers={"Idempotency-Key": "key-1"})
    assert first.status_code == 201, first.text
    with pytest.raises(grpc.RpcError) as replayed:
        running.stub.Place(pb.PlaceRequest(gpus=2), metadata=(("idempotency-key", " key-1 "),))
    assert replayed.value.code() == grpc.StatusCode.ALREADY_EXISTS, replayed.value.details()
    listed = running.stub.ListAllocations(pb.ListAllocationsRequest())
    assert [a.id for a in listed.allocations] == [first.json()["id"]]
    # Nothing but spaces is no key, as REST's empty header is not.
    with pytest.raises(grpc.RpcError) as blank:
        running.stub.Place(pb.PlaceRequest(gpus=2), metadata=(("idempotency-key", "  "),))
    assert blank.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(blank.value) == "invalid_request"
