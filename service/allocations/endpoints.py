"""HTTP routes for /place, /score and allocations."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Response, status

from service import score_pages
from service.allocations import observed as service
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
from service.responses import FastJSON
from service.state import ServiceState

router = APIRouter(prefix="/v1", tags=["placement"])
# Responses are built as plain data by service.py in the documented shapes
# (response_model); returning them as FastJSON skips a second validation.
State = Annotated[ServiceState, Depends(get_state)]
# Lengths as the database columns hold them; control characters are refused for every
# path and query parameter by the request guard (service.edge.guard).
AllocationId = Annotated[str, Path(min_length=1, max_length=64)]
JobId = Annotated[str, Path(min_length=1, max_length=256)]


@router.post(
    "/place",
    response_model=AllocationView,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "an Idempotency-Key replay: the allocation made before"}},
)
async def place(
    body: PlaceRequest,
    state: State,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=256)] = None,
) -> FastJSON:
    """Choose node(s) and GPUs and reserve them (pending until confirmed or expired)."""
    # Async: the decision runs on the event loop and the commit is awaited
    # (service.place_async), so no worker thread is taken per request.
    allocation, created = await service.place_async(state, body, idempotency_key)
    if created:
        return FastJSON(allocation, status_code=status.HTTP_201_CREATED)
    return FastJSON(allocation, headers={"Idempotent-Replayed": "true"})


# A /score of up to this many named nodes runs on the event loop (about a millisecond for
# 500): handing it to a worker thread cost more than the scoring. Larger ones, up to
# every node of the cluster, go to a thread so the loop keeps serving meanwhile.
SCORE_ON_LOOP_NODES = 2_000


@router.post("/score", response_model=ScoreResult)
async def score(
    body: ScoreRequest,
    state: State,
    limit: Annotated[int | None, Query(ge=1, description="nodes in this page")] = None,
    offset: Annotated[int, Query(ge=0, description="nodes of the answer skipped")] = 0,
) -> Response:
    """Rank nodes for a request without reserving: per node the GPUs it would get, or why not.

    At most TOPOPLACE_MAX_SCORE_NODES nodes per answer; page larger ones with limit/offset."""
    maximum = state.settings.max_score_nodes
    count = score_pages.listed_count(body.nodes, len(state.cluster))
    if score_pages.check_bound(count, limit, offset, maximum):
        rows = await off_loop(service.score, state, body)
        return Response(
            score_pages.page_json(rows, limit, offset, maximum), media_type="application/json"
        )
    if body.nodes is not None and len(body.nodes) <= SCORE_ON_LOOP_NODES:
        encoded = service.score_json(state, body)
    else:
        encoded = await off_loop(service.score_json, state, body)
    return Response(encoded, media_type="application/json")


@router.get("/allocations", response_model=AllocationList)
def list_allocations(
    state: State,
    job_id: Annotated[str | None, Query(max_length=256)] = None,
    node: Annotated[str | None, Query(max_length=253)] = None,
    allocation_state: Annotated[AllocationState | None, Query(alias="state")] = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 500,
) -> FastJSON:
    allocations = service.listing(state, job_id, node, allocation_state, limit)
    return FastJSON({"allocations": allocations})


@router.get("/allocations/{allocation_id}", response_model=AllocationView)
def get_allocation(allocation_id: AllocationId, state: State) -> FastJSON:
    return FastJSON(service.get(state, allocation_id))


@router.post("/allocations/{allocation_id}/confirm", response_model=AllocationView)
def confirm(allocation_id: AllocationId, state: State) -> FastJSON:
    """pending -> active (the scheduler bound the job); active allocations never expire."""
    return FastJSON(service.confirm(state, allocation_id))


@router.post("/allocations/{allocation_id}/extend", response_model=AllocationView)
def extend(allocation_id: AllocationId, body: ExtendRequest, state: State) -> FastJSON:
    return FastJSON(service.extend(state, allocation_id, body.ttl_s))


@router.post("/allocations/{allocation_id}/release", response_model=ReleaseResult)
def release(allocation_id: AllocationId, state: State) -> ReleaseResult:
    return ReleaseResult(released=service.release(state, allocation_id))


@router.post("/jobs/{job_id}/release", response_model=ReleaseResult)
def release_job(job_id: JobId, state: State) -> ReleaseResult:
    """Release every live allocation of a job (e.g. from a Slurm epilog)."""
    return ReleaseResult(released=service.release_job(state, job_id))
