"""Over gRPC as over REST: control characters in any string are INVALID_ARGUMENT."""

from __future__ import annotations

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf.message import Message
from google.rpc import error_details_pb2

from placement.request import MAX_NODE_NAMES
from service import schema
from service.access import Role
from service.db import make_engine
from service.grpc.gen import topoplace_pb2 as pb
from service.tokens import store
from tests.service.grpc.conftest import Running, details, reason, snapshot_request


def _fails(call, request, metadata=()) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, metadata=metadata)
    return caught.value


@pytest.mark.parametrize(
    ("method", "message", "field"),
    [
        ("Place", pb.PlaceRequest(gpus=1, job_id="job\x00"), "job_id"),
        ("Place", pb.PlaceRequest(gpus=1, owner="team\x00"), "owner"),
        ("ReleaseJob", pb.ReleaseJobRequest(job_id="\x00"), "job_id"),
        ("GetAllocation", pb.GetAllocationRequest(id="a\x00"), "id"),
        ("Heartbeat", pb.HeartbeatRequest(node="n\x00"), "node"),
        ("ListAllocations", pb.ListAllocationsRequest(job_id="\x00"), "job_id"),
    ],
)
def test_nul_never_reaches_the_database(
    running: Running, method: str, message: object, field: str
) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    error = _fails(getattr(running.stub, method), message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason(error) == "invalid_request"
    assert details(error)["BadRequest"].field_violations[0].field == field
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []


def test_an_empty_idempotency_key_is_refused(running: Running) -> None:
    # (Control characters in metadata are refused by gRPC itself, before the call is made.)
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=1), (("idempotency-key", ""),))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []


def test_a_count_sent_as_true_over_rest_has_no_grpc_twin(running: Running) -> None:
    # Protobuf fields are typed; the REST rules hold for what gRPC converts.
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    assert running.stub.Place(pb.PlaceRequest(gpus=2, ttl_s=60.0)).state == "pending"


@pytest.mark.parametrize(
    ("method", "message", "field"),
    [
        ("ReleaseJob", pb.ReleaseJobRequest(), "job_id"),
        ("ReleaseJob", pb.ReleaseJobRequest(job_id="j" * 257), "job_id"),
        ("ReleaseAllocation", pb.ReleaseAllocationRequest(id="a" * 65), "id"),
        ("ConfirmAllocation", pb.ConfirmAllocationRequest(id="a" * 65), "id"),
        ("ExtendAllocation", pb.ExtendAllocationRequest(id="a" * 65, ttl_s=5), "id"),
        ("GetAllocation", pb.GetAllocationRequest(id="a" * 65), "id"),
    ],
)
def test_ids_are_bounded_as_rest_bounds_them(
    running: Running, method: str, message: object, field: str
) -> None:
    # REST refuses an empty job id and one over 256 characters (an
    # allocation id over 64); a message that leaves job_id unset must not release
    # anything, nor can an allocation be placed with job_id "" (refused as REST does).
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    empty = _fails(running.stub.Place, pb.PlaceRequest(gpus=1, job_id=""))
    assert empty.code() == grpc.StatusCode.INVALID_ARGUMENT, empty.details()
    assert details(empty)["BadRequest"].field_violations[0].field == "job_id"
    placed = running.rest.post("/v1/place", json={"gpus": 1, "job_id": "j1"})
    assert placed.status_code == 201, placed.text
    empty_job = running.rest.post("/v1/jobs//release")
    assert empty_job.status_code == 422, empty_job.text
    assert empty_job.json()["error"]["detail"]["field"] == "path.job_id"
    error = _fails(getattr(running.stub, method), message)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "invalid_request"
    assert details(error)["BadRequest"].field_violations[0].field == field
    live = running.stub.ListAllocations(pb.ListAllocationsRequest(state="pending"))
    assert [a.id for a in live.allocations] == [placed.json()["id"]]


@pytest.mark.parametrize(
    "message",
    [
        pb.PlaceRequest(gpus=1, gpu_models=["zz"] * 65),
        pb.PlaceRequest(gpus=1, regions=[f"r{i}" for i in range(65)]),
        pb.PlaceRequest(gpus=1, node_labels={f"k{i}": "v" for i in range(65)}),
    ],
    ids=["gpu_models", "regions", "node_labels"],
)
@pytest.mark.parametrize("method", ["Place", "Score"])
def test_a_filter_list_past_its_bound_is_refused_by_name(
    running: Running, method: str, message: pb.PlaceRequest
) -> None:
    """As REST (tests/service/allocations/test_input_rules.py): a repeated field a client
    may fill up to the message limit is bounded where every entry costs work."""
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    [(field, _)] = [(d.name, v) for d, v in message.ListFields() if d.name != "gpus"]
    request = (
        message if method == "Place" else pb.ScoreRequest.FromString(message.SerializeToString())
    )
    error = _fails(getattr(running.stub, method), request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "invalid_request"
    assert details(error)["BadRequest"].field_violations[0].field == field
    assert "64" in error.details()
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []


def _violated_field(error: grpc.RpcError) -> str:
    found = details(error)["BadRequest"]
    assert isinstance(found, error_details_pb2.BadRequest)
    return found.field_violations[0].field


@pytest.mark.parametrize(
    ("method", "message", "field"),
    [
        ("Heartbeat", pb.HeartbeatRequest(), "node"),
        ("Heartbeat", pb.HeartbeatRequest(node="n" * 254), "node"),
        ("GetNode", pb.GetNodeRequest(), "name"),
        ("GetNode", pb.GetNodeRequest(name="n" * 254), "name"),
    ],
)
def test_node_names_are_bounded_as_rest_bounds_them(
    running: Running, method: str, message: Message, field: str
) -> None:
    """REST's path takes a node name of 1 to 253 characters (nodes/endpoints.py)."""
    with pytest.raises(grpc.RpcError) as caught:
        getattr(running.stub, method)(message)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
    assert reason(caught.value) == "invalid_request"
    assert _violated_field(caught.value) == field


def test_a_region_agent_cannot_write_megabytes_into_the_audit_log(running: Running) -> None:
    """A region-scoped agent may report a node its replica does not know yet, so the
    interceptor lets any name through; REST's path bounds the name, gRPC's ``node`` was
    not: a report refused for naming another node than its snapshot's wrote an audit row
    carrying the name twice (its nodes and its message), a megabyte each, one a window
    for every such name."""
    engine = make_engine(running.state.settings.database_url)
    _, agent = store.create(engine, Role.AGENT, store.Scope(region="default"), "rack agent")
    request = snapshot_request("hgx-h100", "h9")
    request.node = "h" * 1_000_000
    with pytest.raises(grpc.RpcError) as caught:
        running.stub.ReportSnapshot(request, metadata=(("authorization", f"Bearer {agent}"),))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(schema.audit_log.c.nodes, schema.audit_log.c.detail))
        largest = max((len(n) + len(d) for n, d in rows), default=0)
    engine.dispose()
    assert largest < 10_000
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _violated_field(caught.value) == "node"


def _names(count: int) -> list[str]:
    return ["h0"] + [f"n{i}" for i in range(count - 1)]


@pytest.mark.parametrize("method", ["Place", "Score"])
def test_node_lists_are_bounded_as_over_rest(running: Running, method: str) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    message = pb.PlaceRequest if method == "Place" else pb.ScoreRequest
    call = getattr(running.stub, method)
    for field, request in (
        ("nodes", message(gpus=1, nodes=pb.NodeNames(names=_names(MAX_NODE_NAMES + 1)))),
        ("exclude_nodes", message(gpus=1, exclude_nodes=_names(MAX_NODE_NAMES + 1))),
    ):
        error = _fails(call, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason(error) == "invalid_request"
        assert details(error)["BadRequest"].field_violations[0].field == field
        assert str(MAX_NODE_NAMES) in (error.details() or "")
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []
    names = _names(MAX_NODE_NAMES)
    if method == "Place":
        placed = call(message(gpus=1, nodes=pb.NodeNames(names=names), exclude_nodes=names[1:]))
        assert placed.tasks[0].node == "h0"
    else:
        page = call(message(gpus=1, nodes=pb.NodeNames(names=names), limit=5))
        assert page.total == MAX_NODE_NAMES


@pytest.mark.parametrize("method", ["Place", "Score"])
def test_a_placement_message_past_rests_body_limit_is_refused(
    running: Running, method: str
) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    settings = running.state.settings
    limit = settings.max_placement_body_bytes
    assert limit < settings.max_body_bytes
    message = pb.PlaceRequest if method == "Place" else pb.ScoreRequest
    # Few long names: over the byte limit, well within the count.
    names = [f"{i:04d}" + "x" * 240 for i in range(limit // 240)]
    error = _fails(getattr(running.stub, method), message(gpus=1, exclude_nodes=names))
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert reason(error) == "payload_too_large"
    assert "TOPOPLACE_MAX_PLACEMENT_BODY_BYTES" in (error.details() or "")
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_gpu_fraction_that_is_no_number_is_refused_as_such(
    running: Running, value: float
) -> None:
    """NaN and infinity are not 'not less than 1': the refusal says what is wrong, over
    gRPC (where a double may carry them) as over REST (whose JSON parser reads NaN)."""
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    error = _fails(running.stub.Place, pb.PlaceRequest(gpu_fraction=value))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert reason(error) == "invalid_request"
    assert details(error)["BadRequest"].field_violations[0].field == "gpu_fraction"
    assert "finite number" in error.details()
    token = "NaN" if value != value else "Infinity"
    for path in ("/v1/place", "/v1/score"):
        rest = running.rest.post(
            path,
            content=f'{{"gpu_fraction": {token}}}',
            headers={"Content-Type": "application/json"},
        )
        assert rest.status_code == 422, rest.text
        assert "finite number" in rest.text
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []


def test_a_gpu_fraction_counted_as_a_whole_gpu_is_refused_and_a_fine_one_rounded_up(
    running: Running,
) -> None:
    """Shares are counted in thousandths, rounded up: over gRPC as over REST, past 0.999
    is refused on the field, and the task is told the share counted."""
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    error = _fails(running.stub.Place, pb.PlaceRequest(gpu_fraction=0.9995))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert details(error)["BadRequest"].field_violations[0].field == "gpu_fraction"
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []
    placed = running.stub.Place(pb.PlaceRequest(gpu_fraction=0.3334))
    assert placed.tasks[0].gpu_fraction == 0.334


def test_an_idempotency_key_given_twice_is_refused(running: Running) -> None:
    running.stub.ReportSnapshot(snapshot_request("hgx-h100", "h0"))
    both = (("idempotency-key", "a"), ("idempotency-key", "b"))
    error = _fails(running.stub.Place, pb.PlaceRequest(gpus=1), both)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert running.stub.ListAllocations(pb.ListAllocationsRequest()).allocations == []
