"""Refusals over gRPC: one status code per outcome, with the REST code and details."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from service.grpc.gen import topoplace_pb2 as pb
from tests.service.grpc.conftest import Running, details, reason, snapshot_request


def _fails(call, request, metadata=()) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, metadata=metadata)
    return caught.value


def test_invalid_arguments_name_the_field(running: Running) -> None:
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=0))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(error) == "invalid_request"
    violations = details(error)["BadRequest"].field_violations
    assert [v.field for v in violations] == ["gpus"]
    assert error.details().startswith("gpus: ")

    error = _fails(running.stub.Score, pb.ScoreRequest(locality="anywhere"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(error)["BadRequest"].field_violations[0].field == "locality"

    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=1, ttl_s=10**9))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(error) == "bad_request"
    assert details(error)["BadRequest"].field_violations[0].field == "ttl_s"

    error = _fails(running.stub.ListAllocations, pb.ListAllocationsRequest(limit=0))
    assert details(error)["BadRequest"].field_violations[0].field == "limit"
    error = _fails(running.stub.ListAllocations, pb.ListAllocationsRequest(state="gone"))
    assert details(error)["BadRequest"].field_violations[0].field == "state"
    error = _fails(running.stub.ExtendAllocation, pb.ExtendAllocationRequest(id="x", ttl_s=-1))
    assert details(error)["BadRequest"].field_violations[0].field == "ttl_s"

    key = (("idempotency-key", "k" * 257),)
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=1), key)
    assert details(error)["BadRequest"].field_violations[0].field == "idempotency-key"


def test_priority_from_a_client_built_on_the_older_proto_is_refused(running: Running) -> None:
    # Field 16 (priority, a varint) as such a client still writes it: the current
    # messages reserve the number, so it arrives as an unknown field.
    old_priority = b"\x80\x01\x05"
    for method, message in (("Place", pb.PlaceRequest), ("Score", pb.ScoreRequest)):
        call = running.channel.unary_unary(
            f"/topoplace.v1.Topoplace/{method}",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        error = _fails(call, message(gpus=1).SerializeToString() + old_priority)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert [v.field for v in details(error)["BadRequest"].field_violations] == ["priority"]
        assert "never had an effect" in error.details()
    # Any other unknown field is ignored, as protobuf does.
    unknown = running.channel.unary_unary(
        "/topoplace.v1.Topoplace/Score",
        request_serializer=lambda raw: raw,
        response_deserializer=pb.ScoreResponse.FromString,
    )
    assert unknown(pb.ScoreRequest(gpus=1).SerializeToString() + b"\xf8\x07\x01").nodes == []


def test_snapshots_that_are_refused(running: Running) -> None:
    error = _fails(
        running.stub.ReportSnapshot, pb.ReportSnapshotRequest(node="n", snapshot_json="{")
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert details(error)["BadRequest"].field_violations[0].field == "snapshot_json"

    good = snapshot_request("hgx-h100", "h0")
    broken = good.snapshot_json.replace('"cpu_isa":"x86_64"', '"cpu_isa":"sparc"', 1)
    error = _fails(
        running.stub.ReportSnapshot, pb.ReportSnapshotRequest(node="h0", snapshot_json=broken)
    )
    field = details(error)["BadRequest"].field_violations[0].field
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field == "snapshot_json.cpu_isa"

    renamed = pb.ReportSnapshotRequest(node="other", snapshot_json=good.snapshot_json)
    error = _fails(running.stub.ReportSnapshot, renamed)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and reason(error) == "bad_request"
    assert details(error)["BadRequest"].field_violations[0].field == "snapshot.name"

    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0", seq=5))
    error = _fails(running.stub.ReportSnapshot, snapshot_request("hgx-h100", "h0", seq=4))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(error) == "conflict"
    assert details(error)["ErrorInfo"].metadata["stored_seq"] == "5"


def test_not_found(running: Running) -> None:
    for call, request in [
        (running.stub.GetNode, pb.GetNodeRequest(name="nope")),
        (running.stub.Heartbeat, pb.HeartbeatRequest(node="nope")),
        (running.stub.GetAllocation, pb.GetAllocationRequest(id="nope")),
        (running.stub.ConfirmAllocation, pb.ConfirmAllocationRequest(id="nope")),
        (running.stub.ExtendAllocation, pb.ExtendAllocationRequest(id="nope", ttl_s=5)),
        (running.stub.ReleaseAllocation, pb.ReleaseAllocationRequest(id="nope")),
    ]:
        error = _fails(call, request)
        assert error.code() == grpc.StatusCode.NOT_FOUND, call
        assert reason(error) == "not_found"
    # A job without live allocations has nothing to release: not an error.
    assert not running.stub.ReleaseJob(pb.ReleaseJobRequest(job_id="nope")).released


def test_unschedulable_and_unresolvable_are_told_apart(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=16, locality="nvlink"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert reason(error) == "unresolvable"
    assert details(error)["PlacementRefusal"].reasons
    assert "RetryInfo" not in details(error)

    running.stub.Place(pb.PlaceRequest(gpus=8))
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=2))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(error) == "unschedulable"
    found = details(error)
    assert found["RetryInfo"].retry_delay.seconds == 5
    refusal = found["PlacementRefusal"].reasons[0]
    assert (refusal.cause, refusal.nodes, refusal.resolvable) == ("busy", 1, True)


def test_idempotency_replay_is_already_exists_with_the_allocation(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    key = (("idempotency-key", "pod-uid-123"),)
    first = running.stub.Place(pb.PlaceRequest(gpus=2), metadata=key)
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=2), key)
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert reason(error) == "idempotent_replay"
    found = details(error)
    assert found["Allocation"] == first
    assert found["ErrorInfo"].metadata["allocation_id"] == first.id
    assert len(running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations) == 1
    # The key is shared with REST: the same key there replays the same allocation.
    rest = running.rest.post(
        "/v1/place", json={"gpus": 2}, headers={"Idempotency-Key": "pod-uid-123"}
    )
    assert rest.status_code == 200 and rest.json()["id"] == first.id

    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=3), key)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and reason(error) == "conflict"


def test_state_conflicts(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    placed = running.stub.Place(pb.PlaceRequest(gpus=1))
    running.stub.ReleaseAllocation(pb.ReleaseAllocationRequest(id=placed.id))
    error = _fails(running.stub.ConfirmAllocation, pb.ConfirmAllocationRequest(id=placed.id))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert details(error)["ErrorInfo"].metadata["state"] == "released"
    error = _fails(running.stub.ExtendAllocation, pb.ExtendAllocationRequest(id=placed.id, ttl_s=5))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_message_over_the_body_limit_is_refused(running: Running) -> None:
    limit = running.state.settings.max_body_bytes
    huge = pb.ReportSnapshotRequest(node="n", snapshot_json="x" * (limit + 1))
    error = _fails(running.stub.ReportSnapshot, huge)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_heartbeat_counters_that_are_refused_keep_nothing(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("dgx1-v100", "dgx0"))
    before = running.rest.get("/v1/nodes/dgx0").json()["heartbeat_at"]
    for report, field in (
        ("{", "report_json"),
        ('{"nvlink": [{"gpu": 8, "link": 0}]}', "nvlink.0.gpu"),  # a DGX-1 has GPUs 0-7
        ('{"nvlink": [{"gpu": 0, "link": 0, "tx_bytes": -1}]}', "report_json.nvlink.0.tx_bytes"),
    ):
        request = pb.HeartbeatRequest(node="dgx0", report_json=report)
        error = _fails(running.stub.Heartbeat, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, report
        assert details(error)["BadRequest"].field_violations[0].field == field, report
    assert running.rest.get("/v1/nodes/dgx0/nvlink").json()["links"] == []
    assert running.rest.get("/v1/nodes/dgx0").json()["heartbeat_at"] == before


def test_a_refusal_too_long_for_the_trailer_keeps_its_code(running: Running) -> None:
    # Label keys are up to 317 characters and a refusal names five of them, in the
    # message and in each reason: with letters past ASCII, percent-encoded in grpc-message
    # and base64 in the details, the trailer passed the 16 KiB a gRPC client takes. The
    # client read RESOURCE_EXHAUSTED "Stream removed" (retry later) where REST says
    # unresolvable (change the request).
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    labels = {("é" * 300) + str(i): "ü" * 63 for i in range(10)}
    rest = running.rest.post("/v1/place", json={"gpus": 1, "node_labels": labels})
    assert rest.status_code == 422 and rest.json()["error"]["code"] == "unresolvable"
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=1, node_labels=labels))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION, error.details()
    assert reason(error) == "unresolvable"
    refusal = details(error)["PlacementRefusal"]
    assert isinstance(refusal, pb.PlacementRefusal)
    [group] = refusal.reasons
    assert group.cause == "labels" and not group.resolvable
    assert str(error.details()).startswith("the cluster can never hold this request")


def test_a_watch_of_many_unknown_kinds_is_an_invalid_argument(running: Running) -> None:
    # The refusal listed every unknown kind: 100,000 of them made 3.4 MB of status
    # message, and the client read RESOURCE_EXHAUSTED "Stream removed".
    kinds = [f"kind-{i:08d}" for i in range(100_000)]
    with pytest.raises(grpc.RpcError) as caught:
        next(iter(running.stub.Watch(pb.WatchRequest(kinds=kinds), timeout=10)))
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "invalid_request"
    violations = details(error)["BadRequest"]
    assert isinstance(violations, error_details_pb2.BadRequest)
    assert violations.field_violations[0].field == "kinds"
    assert len(str(error.details()).encode()) <= 1024


def test_a_refusal_of_the_whole_request_reads_as_over_rest(running: Running) -> None:
    # A rule across fields names no field: the message began with ": " over gRPC.
    rest = running.rest.post("/v1/place", json={"gpus": 2, "mig_profile": "1g.10gb"})
    assert rest.status_code == 422
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=2, mig_profile="1g.10gb"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details() == rest.json()["error"]["message"]
    assert str(error.details()).startswith("Value error, gpus must be 1 with mig_profile")


def test_many_field_violations_are_cut_to_the_first_that_fit(running: Running) -> None:
    # 128 violations make 9.5 KB of BadRequest, past what the trailers carry: the first
    # ones are sent, never none.
    request = pb.PlaceRequest(gpus=1, gpu_models=[""] * 64, regions=[""] * 64)
    error = _fails(running.stub.Place, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = details(error)["BadRequest"]
    assert isinstance(violations, error_details_pb2.BadRequest)
    assert 1 <= len(violations.field_violations) < 128
    assert violations.field_violations[0].field == "gpu_models.0"
