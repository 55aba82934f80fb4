"""HTTP routes for /place, /score and allocations."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status

from service.allocations import api, score_pages
from service.allocations.encoding import allocation_json, allocation_list_json
from service.allocations.schemas import (
    AllocationList,
    AllocationState,
    AllocationView,
    ExtendRequest,
    PlaceRequest,
    ReleaseResult,
    ScoreRequest,
    ScoreResult,
)
from service.deps import get_state
from service.event_loop import off_loop
from service.state import ServiceState

router = APIRouter(prefix="/v1", tags=["placement"])
# The API answers typed results in the documented shapes (response_model); they are
# encoded here (encoding.py) and returned as bytes, which skips a second validation.
State = Annotated[ServiceState, Depends(get_state)]
# Lengths as the database columns hold them; control characters are refused for every
# path and query parameter by the request guard (service.edge.guard).
AllocationId = Annotated[str, Path(min_length=1, max_length=64)]
JobId = Annotated[str, Path(min_length=1, max_length=256)]
JSON = "application/json"


def _json(body: bytes) -> Response:
    return Response(body, media_type=JSON)


@router.post(
    "/place",
    response_model=AllocationView,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "an Idempotency-Key replay: the allocation made before"}},
)
async def place(
    body: PlaceRequest,
    state: State,
    request: Request,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=256)] = None,
) -> Response:
    """Choose node(s) and GPUs and reserve them (pending until confirmed or expired)."""
    # Async: the decision runs on the event loop and the commit is awaited
    # (api.place_async), so no worker thread is taken per request.
    placed = await api.place_async(state, body, idempotency_key)
    if placed.created and idempotency_key is None and await request.is_disconnected():
        # The client hung up before its answer: without a key it cannot learn this
        # reservation, and its retry would reserve again (gRPC does the same:
        # service/grpc/abandoned.py). The check is one non-blocking receive.
        await off_loop(api.release, state, placed.allocation.id)
        return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
    encoded = allocation_json(placed.allocation)
    if placed.created:
        return Response(encoded, status_code=status.HTTP_201_CREATED, media_type=JSON)
    return Response(encoded, headers={"Idempotent-Replayed": "true"}, media_type=JSON)


# A /score of up to this many named nodes runs on the event loop (about a millisecond for
# 500): handing it to a worker thread cost more than the scoring. Larger ones, up to
# every node of the cluster, go to a thread so the loop keeps serving meanwhile.
SCORE_ON_LOOP_NODES = 2_000


@router.post("/score", response_model=ScoreResult)
async def score(
    body: ScoreRequest,
    state: State,
    limit: Annotated[int | None, Query(ge=1, description="nodes in this page")] = None,
    offset: Annotated[
        int, Query(ge=0, le=score_pages.MAX_OFFSET, description="nodes of the answer skipped")
    ] = 0,
) -> Response:
    """Rank nodes for a request without reserving: per node the GPUs it would get, or why not.

    At most TOPOPLACE_MAX_SCORE_NODES nodes per answer; page larger ones with limit/offset."""
    maximum = state.settings.max_score_nodes
    count = score_pages.listed_count(body.nodes, len(state.cluster))
    if score_pages.check_bound(count, limit, offset, maximum):
        rows = await off_loop(api.score, state, body)
        return Response(
            score_pages.page_json(rows, limit, offset, maximum), media_type="application/json"
        )
    if body.nodes is not None and len(body.nodes) <= SCORE_ON_LOOP_NODES:
        encoded = api.score_json(state, body)
    else:
        encoded = await off_loop(api.score_json, state, body)
    return _json(encoded)


@router.get("/allocations", response_model=AllocationList)
def list_allocations(
    state: State,
    job_id: Annotated[str | None, Query(max_length=256)] = None,
    node: Annotated[str | None, Query(max_length=253)] = None,
    allocation_state: Annotated[AllocationState | None, Query(alias="state")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> Response:
    allocations = api.listing(state, job_id, node, allocation_state, limit)
    return _json(allocation_list_json(allocations))


@router.get("/allocations/{allocation_id}", response_model=AllocationView)
def get_allocation(allocation_id: AllocationId, state: State) -> Response:
    return _json(allocation_json(api.get(state, allocation_id)))


@router.post("/allocations/{allocation_id}/confirm", response_model=AllocationView)
def confirm(allocation_id: AllocationId, state: State) -> Response:
    """pending -> active (the scheduler bound the job); active allocations never expire."""
    return _json(allocation_json(api.confirm(state, allocation_id)))


@router.post("/allocations/{allocation_id}/extend", response_model=AllocationView)
def extend(allocation_id: AllocationId, body: ExtendRequest, state: State) -> Response:
    return _json(allocation_json(api.extend(state, allocation_id, body.ttl_s)))


@router.post("/allocations/{allocation_id}/release", response_model=ReleaseResult)
def release(allocation_id: AllocationId, state: State) -> ReleaseResult:
    return ReleaseResult(released=list(api.release(state, allocation_id).ids))


# ``:path``: a job id may hold "/" (a Kubernetes gang's is "k8s-gang:NAMESPACE/NAME"), and
# a client's %2F reaches the router decoded; without it such a job had no route here.
@router.post("/jobs/{job_id:path}/release", response_model=ReleaseResult)
def release_job(job_id: JobId, state: State) -> ReleaseResult:
    """Release every live allocation of a job (e.g. from a Slurm epilog). The job is
    remembered as ended for TOPOPLACE_ENDED_JOB_MEMORY_S: a Slurm prolog's report of its
    start processed meanwhile records nothing (docs/slurm.md)."""
    return ReleaseResult(released=list(api.release_job(state, job_id, ended=True).ids))
