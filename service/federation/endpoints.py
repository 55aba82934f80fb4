"""HTTP routes of the federation: regions register and push; jobs are routed.

On a global service: ``/v1/regions`` (admin registers, updates and retires,
readers list), ``PUT /v1/regions/{region}/summary`` (a region token of that region),
``/v1/federation/place`` and ``/score`` (schedulers). A region's own
``/v1/place`` is unchanged: the Kubernetes extender and the Slurm filter
keep calling their region's service.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Annotated, Any

import httpx
import orjson
from fastapi import APIRouter, Header, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service.edge import revoked_meanwhile
from service.edge.idempotency_header import KEY_LENGTH, idempotency_key
from service.edge.known_query import check_query
from service.errors import (
    BadSignature,
    Conflict,
    InvalidRequest,
    NotFound,
    RegionBusy,
    RegionRetired,
    ReplayedSummary,
    ServiceError,
)
from service.federation import routing, store, summary_seq
from service.federation.registry import Registry
from service.federation.schemas import (
    REGION_NAME_PATTERN,
    FederatedPlacement,
    FederatedPlaceRequest,
    FederatedScore,
    RegionCreated,
    RegionList,
    RegionRequest,
    RegionUpdate,
    RegionView,
    SummaryAccepted,
    SummaryReport,
)
from service.federation.signing import verify_summary
from service.federation.store import NameTaken, RegionRecord
from service.federation.summary_refusals import SummaryRefusals

router = APIRouter(tags=["federation"])
JSON = "application/json"
RegionPath = Annotated[str, Path(min_length=1, max_length=63, pattern=REGION_NAME_PATTERN)]


def _registry(request: Request) -> Registry:
    registry: Registry = request.app.state.federation
    return registry


def _client(request: Request) -> httpx.AsyncClient:
    client: httpx.AsyncClient = request.app.state.federation_client
    return client


def view(record: RegionRecord, registry: Registry) -> dict[str, Any]:
    summary = None
    if record.summary is not None and record.summary_at is not None:
        summary = {
            "seq": record.summary_seq,
            "received_at": record.summary_at,
            "stale": registry.is_stale(record, registry.clock()),
            "free_gpus": sum(d["free_gpus"] for d in record.summary.get("designs", ())),
            "stale_nodes": record.summary.get("stale_nodes", 0),
            "live_allocations": record.summary.get("live_allocations", 0),
            "cut": record.summary.get("cut"),
        }
    return {
        "name": record.name,
        "cloud": record.cloud,
        "location": record.location,
        "url": record.url,
        "public_key": record.public_key,
        "prices": record.prices,
        "egress": record.egress,
        "labels": record.labels,
        "token_id": record.token_id,
        "registered_at": record.registered_at,
        "retired_at": record.retired_at,
        "summary": summary,
    }


@router.post("/v1/regions", response_model=RegionCreated, status_code=status.HTTP_201_CREATED)
def register_region(body: RegionRequest, request: Request) -> dict[str, Any]:
    """Register a region. The answer holds its region token (``token``), shown only now:
    the region's service pushes its summaries with it (docs/federation.md)."""
    registry = _registry(request)
    # A route waits for a worker thread after its token check: a token revoked meanwhile
    # writes nothing (service/edge/revoked_meanwhile.py), here a region and its token.
    revoked_meanwhile.refuse_if_revoked()
    try:
        record, secret = store.register(
            registry.engine, body.model_dump(mode="json"), registry.clock()
        )
    except NameTaken:
        raise Conflict(
            f"a region named {body.name!r} is registered (retired regions keep their name)",
            {"field": "name"},
        ) from None
    registry.invalidate()
    return {**view(record, registry), "token": secret}


@router.get("/v1/regions", response_model=RegionList)
def list_regions(
    request: Request,
    retired: Annotated[bool, Query(description="include retired regions")] = False,
) -> dict[str, Any]:
    registry = _registry(request)
    records = store.listed(registry.engine, include_retired=retired)
    return {"regions": [view(r, registry) for r in records]}


def _found(registry: Registry, name: str) -> RegionRecord:
    record = store.get(registry.engine, name)
    if record is None:
        raise NotFound(f"no region {name!r} (GET /v1/regions lists them)")
    return record


@router.get("/v1/regions/{region}", response_model=RegionView)
def show_region(region: RegionPath, request: Request) -> dict[str, Any]:
    registry = _registry(request)
    return view(_found(registry, region), registry)


@router.patch("/v1/regions/{region}", response_model=RegionView)
def update_region(region: RegionPath, body: RegionUpdate, request: Request) -> dict[str, Any]:
    """Set a live region's ``url`` or ``forward_token`` again, checked as registration
    checks them: a key whose region's URL was wrong goes to the new one on its retry,
    from every replica (each reads the URL before it forwards)."""
    registry = _registry(request)
    revoked_meanwhile.refuse_if_revoked()  # forwards (and their token) sent elsewhere
    try:
        record = store.update(registry.engine, region, body.changes(), registry.clock())
    except store.Retired:
        raise RegionRetired(
            f"region {region!r} is retired: nothing is forwarded to it to change"
        ) from None
    if record is None:
        raise NotFound(f"no region {region!r} (GET /v1/regions lists them)")
    registry.invalidate()
    return view(record, registry)


@router.post("/v1/regions/{region}/retire", response_model=RegionView)
def retire_region(
    region: RegionPath,
    request: Request,
    force: Annotated[
        bool, Query(description="retire even while its summary shows live allocations")
    ] = False,
) -> dict[str, Any]:
    """Stop routing to a region and revoke its token; it stays listed (``?retired=true``)."""
    registry = _registry(request)
    record = _found(registry, region)
    live = (record.summary or {}).get("live_allocations", 0)
    if record.retired_at is None and live and not force:
        raise RegionBusy(
            f"region {region!r} has {live} live allocation(s) by its last summary: release"
            " them, or retire with force=true (they keep running there, unrouted)",
            {"live_allocations": live},
        )
    revoked_meanwhile.refuse_if_revoked()
    retired = store.retire(registry.engine, region, registry.clock())
    assert retired is not None
    request.app.state.token_check.drop(retired.token_id)
    registry.invalidate()
    return view(retired, registry)


@router.put("/v1/regions/{region}/summary", response_model=SummaryAccepted)
def push_summary(region: RegionPath, body: SummaryReport, request: Request) -> dict[str, Any]:
    """A region's signed summary: kept when its signature is the region's and its seq is
    newer than the stored one. A refusal is counted, and leaves an audit row (``summary``,
    the refusal's code as the action) at most once a window per region and code, the
    others folded into it (service/federation/summary_refusals.py)."""
    registry = _registry(request)
    try:
        return _push_summary(registry, region, body)
    except ServiceError as refusal:
        refusals: SummaryRefusals = request.app.state.summary_refusals
        refusals.refused(region, body.summary.seq, refusal)
        raise


def _push_summary(registry: Registry, region: str, body: SummaryReport) -> dict[str, Any]:
    record = _found(registry, region)
    if record.retired_at is not None:
        raise RegionRetired(f"region {region!r} is retired: its summaries are not taken")
    if body.summary.region != region:
        raise InvalidRequest(
            "summary.region", f"names {body.summary.region!r}, pushed for {region!r}"
        )
    summary = body.summary.model_dump(mode="json")
    if not verify_summary(record.public_key, summary, body.signature):
        raise BadSignature(
            f"the signature is not region {region!r}'s over this summary (its registered key;"
            " docs/federation.md, 'Signed summaries')",
            {"field": "signature"},
        )
    seq = body.summary.seq
    now_ns = time.time_ns()  # the clock the region's seq is read from (summary_seq.py)
    summary_seq.check(seq, now_ns)
    now = registry.clock()
    binding = summary_seq.binding_up_to(now_ns)
    # The token revoked while this push waited for a worker thread (a leaked region token
    # revoked, its region kept): the summary is not kept (service/edge/revoked_meanwhile.py).
    revoked_meanwhile.refuse_if_revoked()
    if not store.store_summary(registry.engine, region, summary, seq, now, binding):
        raise ReplayedSummary(
            f"seq {seq} is not newer than region {region!r}'s stored summary"
            f" ({record.summary_seq})",
            {"stored_seq": record.summary_seq},
        )
    registry.put(replace(record, summary=summary, summary_seq=seq, summary_at=now))
    return {"region": region, "seq": seq}


@router.post("/v1/federation/score", response_model=FederatedScore, tags=["federation"])
async def federation_score(body: FederatedPlaceRequest, request: Request) -> Response:
    """Rank the regions for a job without reserving: per region the design, predicted
    bandwidth and cost it would get, or why not."""
    candidates = await routing.ranked(_registry(request), body)
    gpus = body.gpus * body.tasks
    views = [routing.candidate_view(c, gpus) for c in candidates]
    return Response(orjson.dumps({"candidates": views}), media_type=JSON)


@router.post(
    "/v1/federation/place",
    response_model=FederatedPlacement,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "an Idempotency-Key replay: the allocation made before"}},
)
async def federation_place(
    body: FederatedPlaceRequest,
    request: Request,
    idempotency_key: Annotated[str | None, Header(**KEY_LENGTH)] = None,
) -> Response:
    """Route a job to the best region and reserve it there (that region's ``/v1/place``,
    the same Idempotency-Key); a refusal sends it to the next region."""
    placed = await routing.place(_registry(request), _client(request), body, idempotency_key)
    # Encoded here, in the documented shape (response_model), without validating it again:
    # routing's own time is what a dispatcher waits for.
    if placed["replayed"]:
        # As /v1/place answers a replay: 200 and the header, so a dispatcher that tells
        # "made now" from "made before" by the status reads both routes alike.
        headers = {"Idempotent-Replayed": "true"}
        return Response(orjson.dumps(placed), headers=headers, media_type=JSON)
    return Response(orjson.dumps(placed), status_code=status.HTTP_201_CREATED, media_type=JSON)


async def _request_body(request: Request) -> FederatedPlaceRequest:
    """The body as FastAPI reads it for the routes above (JSON parsed, then validated as
    Python data), refused in the same shape."""
    raw = await request.body()
    if not raw:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        where = _decode_error_at(raw)
        invalid = {"type": "json_invalid", "loc": ("body", where), "msg": "JSON decode error"}
        raise RequestValidationError([{**invalid, "input": {}}]) from None
    try:
        return FederatedPlaceRequest.model_validate(data, from_attributes=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


def _decode_error_at(raw: bytes) -> int:
    """Where the standard library's parser stops, as FastAPI names a body that is not JSON."""
    try:
        json.loads(raw)
    except json.JSONDecodeError as exc:
        return exc.pos
    except UnicodeDecodeError:
        return 0
    return 0


async def direct_score(request: Request) -> Response:
    check_query(request, _NO_QUERY)  # the router's check (known_query.py) is not on this path
    return await federation_score(await _request_body(request), request)


async def direct_place(request: Request) -> Response:
    check_query(request, _NO_QUERY)
    key = idempotency_key(request)
    return await federation_place(await _request_body(request), request, key)


_NO_QUERY: frozenset[str] = frozenset()
# Dispatchers wait on these for every job: served before FastAPI's router
# (service/direct_routes.py), which cost most of the global service's own time on a
# call; the routes above document them in the OpenAPI schema.
DIRECT = {
    ("POST", "/v1/federation/place"): direct_place,
    ("POST", "/v1/federation/score"): direct_score,
}

__all__ = ["DIRECT", "router"]
