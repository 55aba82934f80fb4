"""One Idempotency-Key, one reservation, whichever API carries the retry."""

from __future__ import annotations

import grpc
import pytest

from placement.profiles import build_profile
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
