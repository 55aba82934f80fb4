"""gRPC Score takes gpu_fraction as REST /score does: the same answer for the same
request, and NaN refused by name."""

from __future__ import annotations

import grpc
import pytest

from service.grpc.gen import topoplace_pb2 as pb
from tests.service.grpc.conftest import Running, details, reason, snapshot_request


def test_score_with_a_share_is_answered_as_rest_answers_it(running: Running) -> None:
    """REST /score refuses a share (422 unsupported: a share's GPU is chosen by /place);
    gRPC Score says the same, not INTERNAL, and not a silent whole-GPU ranking."""
    for name in ("w0", "w1"):
        running.stub.ReportSnapshot(snapshot_request("workstation-2x-a6000", name))
    rest = running.rest.post("/v1/score", json={"gpu_fraction": 0.25})
    assert rest.status_code == 422, rest.text
    assert rest.json()["error"]["code"] == "unsupported"
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.Score(pb.ScoreRequest(gpu_fraction=0.25))
    error = refused.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "unsupported"
    assert details(error)["BadRequest"].field_violations[0].field == "gpu_fraction"
    assert error.details() == rest.json()["error"]["message"]
    # Whole GPUs are ranked over both APIs alike.
    whole = running.stub.Score(pb.ScoreRequest(gpus=1))
    expected = [
        (n["node"], n["score"])
        for n in running.rest.post("/v1/score", json={"gpus": 1}).json()["nodes"]
    ]
    assert [(n.node, n.score) for n in whole.nodes] == expected
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []


def test_score_refuses_a_share_that_is_no_number(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("workstation-2x-a6000", "w0"))
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.Score(pb.ScoreRequest(gpu_fraction=float("nan")))
    error = refused.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "invalid_request"
    assert details(error)["BadRequest"].field_violations[0].field == "gpu_fraction"
    assert "finite number" in (error.details() or "")
