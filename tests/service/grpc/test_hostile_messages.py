"""Hostile messages over gRPC: never UNKNOWN or INTERNAL."""

from __future__ import annotations

import json

import grpc

from service.grpc.gen import topoplace_pb2 as pb
from tests.service.grpc.conftest import Running, snapshot_request

NAN = float("nan")
INF = float("inf")
BAD = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}


def _call(
    running: Running, method: str, request: object, metadata: tuple[tuple[str, str], ...] = ()
) -> None:
    try:
        getattr(running.stub, method)(request, metadata=metadata)
    except grpc.RpcError as error:
        assert error.code() not in BAD, (method, str(request)[:200], error.code(), error.details())


def test_hostile_grpc_messages(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    placed = running.stub.Place(pb.PlaceRequest(gpus=1))
    cases: list[tuple[str, object]] = [
        ("Place", pb.PlaceRequest(gpus=-1)),
        ("Place", pb.PlaceRequest(gpus=0)),
        ("Place", pb.PlaceRequest(gpus=2**31 - 1)),
        ("Place", pb.PlaceRequest(gpus=1, tasks=2**31 - 1)),
        ("Place", pb.PlaceRequest(gpus=1, tasks=-5)),
        ("Place", pb.PlaceRequest(gpus=1, ttl_s=NAN)),
        ("Place", pb.PlaceRequest(gpus=1, ttl_s=INF)),
        ("Place", pb.PlaceRequest(gpus=1, ttl_s=-INF)),
        ("Place", pb.PlaceRequest(gpus=1, ttl_s=1e308)),
        ("Place", pb.PlaceRequest(gpus=1, ttl_s=0)),
        ("Place", pb.PlaceRequest(gpus=1, max_ring_loss=NAN)),
        ("Place", pb.PlaceRequest(gpus=1, max_ring_loss=INF)),
        ("Place", pb.PlaceRequest(gpus=1, max_ring_loss=-1)),
        ("Place", pb.PlaceRequest(gpus=1, gpu_fraction=NAN)),
        ("Place", pb.PlaceRequest(gpus=1, gpu_fraction=-INF)),
        ("Place", pb.PlaceRequest(gpus=1, gpu_fraction=0)),
        ("Place", pb.PlaceRequest(gpus=1, gpu_fraction=5e-324)),
        ("Place", pb.PlaceRequest(gpus=1, min_gpu_memory_mib=2**63 - 1)),
        ("Place", pb.PlaceRequest(gpus=1, min_gpu_memory_mib=-1)),
        ("Place", pb.PlaceRequest(gpus=1, cpu_milli=2**63 - 1)),
        ("Place", pb.PlaceRequest(gpus=1, memory_mib=-(2**63))),
        ("Place", pb.PlaceRequest(gpus=1, cpus_per_task=2**31 - 1)),
        ("Place", pb.PlaceRequest(gpus=1, locality="bogus")),
        ("Place", pb.PlaceRequest(gpus=1, policy="")),
        ("Place", pb.PlaceRequest(gpus=1, objective="\u00e9")),
        ("Place", pb.PlaceRequest(gpus=1, numa="x")),
        ("Place", pb.PlaceRequest(gpus=1, mig_profile="")),
        ("Place", pb.PlaceRequest(gpus=1, mig_profile="1g.5gb", gpu_fraction=0.5)),
        ("Place", pb.PlaceRequest(gpus=1, node_labels={"": ""})),
        ("Place", pb.PlaceRequest(gpus=1, node_labels={"a": "\u202e"})),
        ("Place", pb.PlaceRequest(gpus=1, regions=[""])),
        ("Place", pb.PlaceRequest(gpus=1, gpu_models=["x" * 100000])),
        ("Place", pb.PlaceRequest(gpus=1, job_id="x" * 100000)),
        ("Place", pb.PlaceRequest(gpus=1, owner="x" * 100000)),
        ("Place", pb.PlaceRequest(gpus=1, job_id="\U0001f600")),
        ("Place", pb.PlaceRequest(gpus=1, exclude_nodes=["h0"], nodes=pb.NodeNames(names=["h0"]))),
        (
            "Score",
            pb.ScoreRequest(gpus=1, limit=0),
        ),
        (
            "Score",
            pb.ScoreRequest(gpus=1, offset=-1),
        ),
        (
            "Score",
            pb.ScoreRequest(gpus=1, offset=2**31 - 1),
        ),
        ("Score", pb.ScoreRequest(gpus=1, max_ring_loss=NAN)),
        (
            "Score",
            pb.ScoreRequest(gpus=1, gpu_fraction=0.5),
        ),
        ("ListAllocations", pb.ListAllocationsRequest(limit=0)),
        ("ListAllocations", pb.ListAllocationsRequest(limit=-1)),
        ("ListAllocations", pb.ListAllocationsRequest(limit=2**31 - 1)),
        ("ListAllocations", pb.ListAllocationsRequest(state="bogus")),
        ("ListAllocations", pb.ListAllocationsRequest(state="")),
        ("ListAllocations", pb.ListAllocationsRequest(job_id="")),
        ("ListAllocations", pb.ListAllocationsRequest(node="x" * 1000)),
        ("GetAllocation", pb.GetAllocationRequest(id="")),
        ("GetAllocation", pb.GetAllocationRequest(id="x" * 1000)),
        ("GetAllocation", pb.GetAllocationRequest(id="\u00e9")),
        ("ConfirmAllocation", pb.ConfirmAllocationRequest(id="")),
        ("ReleaseAllocation", pb.ReleaseAllocationRequest(id="")),
        ("ReleaseJob", pb.ReleaseJobRequest(job_id="")),
        ("ReleaseJob", pb.ReleaseJobRequest(job_id="x" * 1000)),
        ("ExtendAllocation", pb.ExtendAllocationRequest(id=placed.id, ttl_s=NAN)),
        ("ExtendAllocation", pb.ExtendAllocationRequest(id=placed.id, ttl_s=INF)),
        ("ExtendAllocation", pb.ExtendAllocationRequest(id=placed.id, ttl_s=0)),
        ("ExtendAllocation", pb.ExtendAllocationRequest(id=placed.id, ttl_s=-1)),
        ("ExtendAllocation", pb.ExtendAllocationRequest(id=placed.id, ttl_s=1e308)),
        ("ExtendAllocation", pb.ExtendAllocationRequest(id="nope", ttl_s=30)),
        ("GetNode", pb.GetNodeRequest(name="")),
        ("GetNode", pb.GetNodeRequest(name="x" * 1000)),
        ("GetNode", pb.GetNodeRequest(name="a/b")),
        ("Heartbeat", pb.HeartbeatRequest(node="")),
        ("Heartbeat", pb.HeartbeatRequest(node="nope")),
        ("Heartbeat", pb.HeartbeatRequest(node="h0", report_json="")),
        ("Heartbeat", pb.HeartbeatRequest(node="h0", report_json="null")),
        ("Heartbeat", pb.HeartbeatRequest(node="h0", report_json="[]")),
        ("Heartbeat", pb.HeartbeatRequest(node="h0", report_json='{"nvlink": NaN}')),
        ("Heartbeat", pb.HeartbeatRequest(node="h0", report_json="[" * 100 + "]" * 100)),
        ("Heartbeat", pb.HeartbeatRequest(node="h0", report_json='{"a":' * 100 + "1" + "}" * 100)),
        ("Heartbeat", pb.HeartbeatRequest(node="h0", report_json="1" * 5000)),
        ("ReportSnapshot", pb.ReportSnapshotRequest(node="h0", snapshot_json="")),
        ("ReportSnapshot", pb.ReportSnapshotRequest(node="h0", snapshot_json="null")),
        ("ReportSnapshot", pb.ReportSnapshotRequest(node="h0", snapshot_json="[]")),
        ("ReportSnapshot", pb.ReportSnapshotRequest(node="h0", snapshot_json="{")),
        ("ReportSnapshot", pb.ReportSnapshotRequest(node="h0", snapshot_json='{"seq": NaN}')),
        (
            "ReportSnapshot",
            pb.ReportSnapshotRequest(node="h0", snapshot_json="[" * 100 + "]" * 100),
        ),
        (
            "ReportSnapshot",
            pb.ReportSnapshotRequest(node="h0", snapshot_json='{"a":' * 100 + "1" + "}" * 100),
        ),
        ("ReportSnapshot", pb.ReportSnapshotRequest(node="h0", snapshot_json="9" * 5000)),
        ("ReportSnapshot", pb.ReportSnapshotRequest(node="", snapshot_json="{}")),
        (
            "ReportSnapshot",
            pb.ReportSnapshotRequest(
                node="h1", snapshot_json=snapshot_request("hgx-h100", "h0", 5).snapshot_json
            ),
        ),
        (
            "ReportSnapshot",
            pb.ReportSnapshotRequest(
                node="h0",
                snapshot_json=snapshot_request("hgx-h100", "h0", 5).snapshot_json,
                signature="",
            ),
        ),
        (
            "ReportSnapshot",
            pb.ReportSnapshotRequest(
                node="h0",
                snapshot_json=snapshot_request("hgx-h100", "h0", 6).snapshot_json,
                signature="!!",
            ),
        ),
        (
            "ReportSnapshot",
            pb.ReportSnapshotRequest(
                node="h0",
                snapshot_json=json.dumps(
                    {
                        **json.loads(snapshot_request("hgx-h100", "h0", 7).snapshot_json),
                        "seq": 2**64,
                    }
                ),
            ),
        ),
    ]
    for method, request in cases:
        _call(running, method, request)
    for md in ((("idempotency-key", ""),), (("idempotency-key", "x" * 1000),)):
        _call(running, "Place", pb.PlaceRequest(gpus=1), md)
    for kinds in ([""], ["bogus"], ["x" * 10000]):
        try:
            for _ in running.stub.Watch(pb.WatchRequest(kinds=kinds), timeout=0.5):
                break
        except grpc.RpcError as error:
            assert error.code() not in BAD, (kinds, error.code(), error.details())
