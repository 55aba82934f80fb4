"""Place and Score take cpu_milli and memory_mib as REST does: counted on the node when
accepted, refused with INVALID_ARGUMENT naming the field when out of range."""

from __future__ import annotations

import grpc
import pytest

from service.grpc.gen import topoplace_pb2 as pb
from tests.service.grpc.conftest import Running, details, reason, snapshot_request

TOO_MANY = 2**31  # one past the request model's bound for both fields


def _two_nodes(running: Running) -> int:
    """Nodes w0 and w1; returns each one's host CPU in milli-CPU."""
    running.stub.ReportSnapshot(snapshot_request("workstation-2x-a6000", "w0"))
    running.stub.ReportSnapshot(snapshot_request("workstation-2x-a6000", "w1"))
    cpu, _ = running.state.cluster.host_room("w0")
    assert cpu is not None  # the profile reports its CPUs
    return cpu


def test_place_counts_the_figures_and_score_skips_a_node_short_of_them(
    running: Running,
) -> None:
    cpu = _two_nodes(running)
    first = running.stub.Place(pb.PlaceRequest(gpus=1, cpu_milli=cpu - 1000, memory_mib=2048))
    node = first.tasks[0].node
    assert running.state.cluster.host_used(node) == (cpu - 1000, 2048)
    # The same request again: the first node still has a GPU, not the CPU.
    ranked = running.stub.Score(pb.ScoreRequest(gpus=1, cpu_milli=cpu - 1000))
    verdicts = {n.node: n for n in ranked.nodes}
    assert not verdicts[node].fits and verdicts[node].cause == "host"
    assert [n.node for n in ranked.nodes if n.fits] == [n for n in ("w0", "w1") if n != node]
    second = running.stub.Place(pb.PlaceRequest(gpus=1, cpu_milli=cpu - 1000))
    assert second.tasks[0].node != node
    # Without figures, nothing is counted: the first node is fine for a request that
    # says nothing of its host use.
    assert running.stub.Place(pb.PlaceRequest(gpus=1, nodes=pb.NodeNames(names=[node]))).id
    # Both nodes now hold that CPU, counted as REST counts it.
    rest = running.rest.post("/v1/score", json={"gpus": 1, "cpu_milli": cpu - 1000}).json()
    assert [n["node"] for n in rest["nodes"] if n["fits"]] == []


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cpu_milli": -1}, "cpu_milli"),
        ({"cpu_milli": TOO_MANY}, "cpu_milli"),
        ({"memory_mib": -1}, "memory_mib"),
        ({"memory_mib": TOO_MANY}, "memory_mib"),
    ],
)
@pytest.mark.parametrize("method", ["Place", "Score"])
def test_out_of_range_figures_are_refused_by_name(
    running: Running, method: str, fields: dict[str, int], field: str
) -> None:
    _two_nodes(running)
    message = getattr(pb, f"{method}Request")(gpus=1, **fields)
    with pytest.raises(grpc.RpcError) as caught:
        getattr(running.stub, method)(message)
    error = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "invalid_request"  # the code REST's 422 carries
    assert details(error)["BadRequest"].field_violations[0].field == field  # type: ignore[attr-defined]
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []
    assert running.state.cluster.host_used("w0") == (0, 0)


def test_zero_is_a_figure_and_unset_is_none(running: Running) -> None:
    """proto3 optional: a zero sent is a figure (the node must have that much free: none
    where its counted use is past its capacity), an unset field is not counted, as
    REST's null."""
    cpu = _two_nodes(running)
    for node in ("w0", "w1"):
        running.state.cluster.set_host_use(node, cpu + 1000, 0)
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.Place(pb.PlaceRequest(gpus=1, cpu_milli=0))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()
    assert running.stub.Place(pb.PlaceRequest(gpus=1)).state == "pending"
