"""A Place answer the client cannot receive is refused before anything is reserved.

A gRPC client receives at most 4 MiB unless its channel says otherwise; a large
gang's answer is more. Committed anyway, the reservation was held while the client
read RESOURCE_EXHAUSTED and no allocation id, and its retry reserved a second set.
"""

from __future__ import annotations

import grpc
import pytest

from placement import NodeSnapshot
from placement.profiles import build_profile
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from tests.service.grpc.conftest import Running, details, reason
from tests.service.helpers import report

# The metadata a client names its raised receive limit in, and gRPC's default.
RECEIVE_LIMIT = "max-receive-message-length"
DEFAULT_RECEIVE_BYTES = 4 * 1024 * 1024
# Long node names and GPU UUIDs (within their bounds) make each 16-GPU task about
# 7 KB, so a gang past 4 MiB needs some 600 nodes instead of thousands.
NODES = 620


def _long_node(index: int) -> NodeSnapshot:
    snap = build_profile("dgx2-v100", f"n{index}-".ljust(200, "x"))
    gpus = [
        gpu.model_copy(update={"uuid": f"GPU-{index}-{k}-".ljust(128, "0")})
        for k, gpu in enumerate(snap.gpus)
    ]
    return snap.model_copy(update={"gpus": gpus})


def _allocations(running: Running) -> list[str]:
    listed = running.rest.get("/v1/allocations")
    assert listed.status_code == 200, listed.text
    return [a["id"] for a in listed.json()["allocations"]]


def test_a_gang_past_the_default_receive_limit_is_refused_and_nothing_is_held(
    running: Running,
) -> None:
    for index in range(NODES):
        response = report(running.rest, _long_node(index))
        assert response.status_code == 200, response.text
    gang = pb.PlaceRequest(gpus=16, tasks=NODES, job_id="big")
    for metadata in ((), (("idempotency-key", "k-big"),)):
        # A default client, as a retrying scheduler sends it: with and without a key.
        for _ in range(2):
            with pytest.raises(grpc.RpcError) as refused:
                running.stub.Place(gang, metadata=metadata)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
            assert reason(refused.value) == "answer_too_large"
            info = details(refused.value)["ErrorInfo"]
            assert info.metadata["limit"] == str(DEFAULT_RECEIVE_BYTES)  # type: ignore[attr-defined]
            assert RECEIVE_LIMIT in (refused.value.details() or "")
    assert _allocations(running) == []
    # Every GPU is still free: the same gang is placed for a client that can read it.
    raised = 64 * 1024 * 1024
    options = [("grpc.max_receive_message_length", raised)]
    with grpc.insecure_channel(f"127.0.0.1:{running.server.port}", options=options) as channel:
        stub = pb_grpc.TopoplaceStub(channel)
        placed = stub.Place(gang, metadata=((RECEIVE_LIMIT, str(raised)),))
    assert len(placed.tasks) == NODES
    assert placed.ByteSize() > DEFAULT_RECEIVE_BYTES
    assert _allocations(running) == [placed.id]


def test_the_limit_a_client_declares_is_the_one_kept(running: Running) -> None:
    report(running.rest, build_profile("dgx2-v100", "a"))
    request = pb.PlaceRequest(gpus=16, job_id="j")
    small = ((RECEIVE_LIMIT, "1000"), ("idempotency-key", "k-1"))
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.Place(request, metadata=small)
    assert reason(refused.value) == "answer_too_large"
    assert _allocations(running) == []
    # The key was not spent on the refusal: under it, the next try reserves.
    placed = running.stub.Place(request, metadata=(("idempotency-key", "k-1"),))
    assert _allocations(running) == [placed.id]


@pytest.mark.parametrize("value", ["", "0", "-1", "4 MiB", "2147483648"])
def test_a_bad_receive_limit_is_refused(running: Running, value: str) -> None:
    report(running.rest, build_profile("dgx2-v100", "a"))
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.Place(pb.PlaceRequest(gpus=1), metadata=((RECEIVE_LIMIT, value),))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(refused.value) == "invalid_request"
    assert _allocations(running) == []


def _placed(running: Running) -> pb.Allocation:
    """One 16-GPU allocation, on a node of its own reported for it."""
    name = f"node-{len(_allocations(running))}"
    assert report(running.rest, build_profile("dgx2-v100", name)).status_code == 200
    return running.stub.Place(pb.PlaceRequest(gpus=16, job_id="j"))


def test_get_allocation_past_the_limit_names_the_id_and_size(running: Running) -> None:
    """A stored allocation (say, a gang placed over REST) past the client's limit used to
    reach it as RESOURCE_EXHAUSTED "Received message larger than max", with nothing said."""
    placed = _placed(running)
    small = ((RECEIVE_LIMIT, "1000"),)
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.GetAllocation(pb.GetAllocationRequest(id=placed.id), metadata=small)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert reason(refused.value) == "answer_too_large"
    info = details(refused.value)["ErrorInfo"]
    assert info.metadata["allocation_id"] == placed.id  # type: ignore[attr-defined]
    assert info.metadata["size"] == str(placed.ByteSize())  # type: ignore[attr-defined]
    assert info.metadata["limit"] == "1000"  # type: ignore[attr-defined]
    assert placed.id in (refused.value.details() or "")
    # Within the declared limit (or the default one) it is answered.
    assert running.stub.GetAllocation(pb.GetAllocationRequest(id=placed.id)) == placed


def test_list_allocations_past_the_limit_is_refused_not_cut(running: Running) -> None:
    """The listing has no pages (as REST's), so a cut answer could not be told from a whole
    one: refused, naming its size, and a smaller ``limit`` is answered."""
    _placed(running)
    _placed(running)
    one = pb.ListAllocationsResponse(allocations=[_placed(running)]).ByteSize()
    limit = str(one + 10)
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.ListAllocations(
            pb.ListAllocationsRequest(), metadata=((RECEIVE_LIMIT, limit),)
        )
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value.details()
    assert reason(refused.value) == "answer_too_large"
    assert details(refused.value)["ErrorInfo"].metadata["limit"] == limit  # type: ignore[attr-defined]
    listed = running.stub.ListAllocations(
        pb.ListAllocationsRequest(limit=1), metadata=((RECEIVE_LIMIT, limit),)
    )
    assert len(listed.allocations) == 1


def _refused_unchanged(running: Running, error: grpc.RpcError, before: pb.Allocation) -> None:
    """Refused with ``answer_too_large`` naming the allocation, which is as it was."""
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "answer_too_large"
    info = details(error)["ErrorInfo"]
    assert info.metadata["allocation_id"] == before.id  # type: ignore[attr-defined]
    assert info.metadata["limit"] == "1000"  # type: ignore[attr-defined]
    assert before.id in (error.details() or "")
    assert running.stub.GetAllocation(pb.GetAllocationRequest(id=before.id)) == before


def test_confirm_past_the_limit_is_refused_before_it_takes_effect(running: Running) -> None:
    """A confirm used to commit, then answer past the client's limit: the client read
    RESOURCE_EXHAUSTED for an allocation it had in fact confirmed."""
    placed = _placed(running)
    request = pb.ConfirmAllocationRequest(id=placed.id)
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.ConfirmAllocation(request, metadata=((RECEIVE_LIMIT, "1000"),))
    _refused_unchanged(running, refused.value, placed)
    # A client that can read it confirms it; so does one whose limit is the size read
    # before (a confirmed allocation's answer is no larger: its expiry is dropped).
    limit = str(placed.ByteSize())
    confirmed = running.stub.ConfirmAllocation(request, metadata=((RECEIVE_LIMIT, limit),))
    assert confirmed.state == "active"


def test_extend_past_the_limit_is_refused_before_it_takes_effect(running: Running) -> None:
    """As a confirm: the new expiry was written, and its answer then refused by the client."""
    placed = _placed(running)
    request = pb.ExtendAllocationRequest(id=placed.id, ttl_s=600)
    with pytest.raises(grpc.RpcError) as refused:
        running.stub.ExtendAllocation(request, metadata=((RECEIVE_LIMIT, "1000"),))
    _refused_unchanged(running, refused.value, placed)
    extended = running.stub.ExtendAllocation(request)
    assert extended.expires_at.ToDatetime() > placed.expires_at.ToDatetime()


def test_a_watch_event_past_the_limit_comes_trimmed_and_the_stream_goes_on(
    running: Running,
) -> None:
    """An allocation event past the watcher's receive limit (a gang placed over REST, say)
    ended its stream: the client read RESOURCE_EXHAUSTED "Received message larger than
    max" and every later event was lost. It now comes without the allocation's tasks,
    marked ``trimmed``, and the stream goes on."""
    assert report(running.rest, build_profile("dgx2-v100", "a")).status_code == 200
    limit = 1000
    options = [("grpc.max_receive_message_length", limit)]
    with grpc.insecure_channel(f"127.0.0.1:{running.server.port}", options=options) as channel:
        stub = pb_grpc.TopoplaceStub(channel)
        stream = stub.Watch(pb.WatchRequest(), metadata=((RECEIVE_LIMIT, str(limit)),), timeout=30)
        assert next(stream).type == "started"
        placed = running.rest.post("/v1/place", json={"gpus": 16, "job_id": "j"}).json()
        small = running.rest.post("/v1/place", json={"gpus": 0, "job_id": "j"})
        running.rest.post("/v1/nodes/a/cordon")
        events = [next(stream) for _ in range(2)]
        stream.cancel()
    big, cordoned = events
    assert (big.type, big.allocation.id, big.allocation.state) == (
        "placed",
        placed["id"],
        "pending",
    )
    assert big.trimmed and not big.allocation.tasks and big.ByteSize() <= limit
    assert small.status_code == 422  # not an event
    assert (cordoned.kind, cordoned.type, cordoned.node, cordoned.trimmed) == (
        "node",
        "cordoned",
        "a",
        False,
    )
    whole = running.stub.GetAllocation(pb.GetAllocationRequest(id=placed["id"]))
    assert len(whole.tasks) == 1 and whole.ByteSize() > limit


def test_a_watch_with_a_bad_receive_limit_is_refused(running: Running) -> None:
    stream = running.stub.Watch(pb.WatchRequest(), metadata=((RECEIVE_LIMIT, "0"),))
    with pytest.raises(grpc.RpcError) as refused:
        next(stream)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(refused.value) == "invalid_request"
