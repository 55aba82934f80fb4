"""Blank choices over gRPC as over REST: refused, never read as "none" or stored blank."""

from __future__ import annotations

import grpc
import pytest

from service.grpc.gen import topoplace_pb2 as pb
from tests.service.grpc.conftest import Running, snapshot_request


@pytest.mark.parametrize(
    "request_",
    [
        pb.PlaceRequest(gpus=1, job_id=""),
        pb.PlaceRequest(gpus=1, mig_profile=""),
        pb.PlaceRequest(gpus=1, gpu_models=[""]),
        pb.PlaceRequest(gpus=1, node_labels={"": "x"}),
        pb.PlaceRequest(gpus=1, exclude_nodes=[""]),
        pb.PlaceRequest(gpus=1, locality=""),
        pb.PlaceRequest(gpus=1, policy=""),
        pb.PlaceRequest(gpus=1, objective=""),
        pb.PlaceRequest(gpus=1, numa=""),
    ],
)
def test_a_blank_choice_is_refused_as_over_rest(
    running: Running, request_: pb.PlaceRequest
) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.Place(request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []
