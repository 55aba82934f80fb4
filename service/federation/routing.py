"""The global place and score: rank the regions, then forward to the best that says yes."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import httpx

from placement.eligibility import model_matches_name
from service.edge import revoked_meanwhile
from service.errors import (
    Conflict,
    InvalidRequest,
    KeyInFlight,
    NoRegion,
    RegionRetired,
    RegionUnavailable,
    ServiceError,
)
from service.event_loop import off_loop
from service.federation import ranking, region_url, store, summary_limits
from service.federation.forward import LOOKED_UP, Asked, Forwarded, Outcome, forward
from service.federation.forward_request import request_text, same_request
from service.federation.registry import Registry
from service.federation.schemas import MAX_GPU_MODEL_NAME, FederatedPlaceRequest
from service.federation.store import RegionRecord

# The region's answers that the key is in use there: its first request still committing,
# or an allocation made for another request.
KEY_IN_USE = frozenset({KeyInFlight.code, Conflict.code})


def job_of(body: FederatedPlaceRequest) -> ranking.Job:
    options = body.federation
    return ranking.Job(
        gpus=body.gpus,
        tasks=body.tasks,
        gpu_models=tuple(body.gpu_models),
        hours=options.hours,
        spot=options.spot,
        regions=frozenset(options.regions),
        clouds=frozenset(options.clouds),
        data_region=options.data.region if options.data else None,
        data_gb=options.data.size_gb if options.data else 0.0,
        cost_weight=options.cost_weight,
        budget_per_hour=options.budget_per_hour,
        floor_island=options.floor.island,
        floor_gbps=options.floor.gbps,
        labels=options.labels,
    )


def check_names(body: FederatedPlaceRequest, regions: list[ranking.Region]) -> None:
    """Regions the request names must be registered: a typo would route nowhere silently."""
    known = {r.name for r in regions}
    options = body.federation
    unknown = sorted(set(options.regions) - known)
    if unknown:
        raise InvalidRequest("federation.regions", f"no registered region {', '.join(unknown)}")
    if options.data is not None and options.data.region not in known:
        raise InvalidRequest(
            "federation.data.region",
            f"no registered region {options.data.region!r} holds data (register it first)",
        )


def cost_view(c: ranking.Candidate, gpus: int) -> dict[str, Any] | None:
    if c.cost is None:
        return None
    return {
        "price_per_gpu_hour": c.cost.price_per_gpu_hour,
        "spot": c.cost.spot,
        "gpu_hours": c.cost.gpu_hours,
        "compute": round(c.cost.compute, 6),
        "egress": round(c.cost.egress, 6),
        "total": round(c.cost.total, 6),
        "per_hour": round(c.cost.per_hour(gpus), 6),
    }


def candidate_view(c: ranking.Candidate, gpus: int) -> dict[str, Any]:
    return {
        "region": c.region,
        "cloud": c.cloud,
        "fits": c.fits,
        "reason": c.reason,
        "stale": c.stale,
        "design": c.design,
        "gpu_model": c.gpu_model,
        "predicted_gbps": c.predicted_gbps,
        "cost": cost_view(c, gpus),
    }


async def ranked(registry: Registry, body: FederatedPlaceRequest) -> list[ranking.Candidate]:
    if registry.due:
        await off_loop(registry.reread)
    regions = registry.regions()
    check_names(body, regions)
    return ranking.rank(job_of(body), regions)


def forward_model(body: FederatedPlaceRequest, chosen: ranking.Candidate) -> str:
    """The GPU model the forward asks the region for: the one the ranking priced. The
    price's model ("H100") names every GPU it covers, an H100 NVL as an H100 80GB HBM3:
    a job whose models do not take all of them ("H100 80GB") goes for the chosen
    design's own model, which it named and which is priced (a region matches a model as
    a whole token of the GPU's name: the whole name takes that model alone). A name the
    region shortened to fit its summary names no GPU: the price's model then."""
    price = chosen.gpu_model
    assert price is not None  # a fitting candidate is priced
    design = chosen.design_model
    if not body.gpu_models or design is None:
        return price
    if any(model_matches_name(m, price) for m in body.gpu_models):
        return price  # a model of the job's is a token of the price's: it takes them all
    if summary_limits.is_shortened(design, MAX_GPU_MODEL_NAME):
        return price
    return design


def forward_body(body: FederatedPlaceRequest, chosen: ranking.Candidate) -> dict[str, Any]:
    sent = body.model_dump(mode="json", exclude={"federation"}, exclude_unset=True)
    # The region places on the model the ranking priced, not on whatever else it has.
    sent["gpu_models"] = [forward_model(body, chosen)]
    return sent


def _pinned(
    region: str, model: str, candidates: list[ranking.Candidate], body: FederatedPlaceRequest
) -> ranking.Candidate:
    """The candidate of the region a key went to before, forwarded with the model it went
    with (a key sent as the price's model before forwards named the design's goes so)."""
    for c in candidates:
        if c.region == region and c.fits and forward_model(body, c) == model:
            return c
    cloud = next((c.cloud for c in candidates if c.region == region), "")
    return ranking.Candidate(
        region, cloud, True, "where this Idempotency-Key went before", gpu_model=model
    )


# How long past its deadline a request may hold its key's row: the row is let go when
# the request ends, so this only matters when the replica holding it died.
HOLD_MARGIN_S = 10.0


class KeyHold:
    """A keyed request's hold on its Idempotency-Key's row (service/federation/store.py):
    held from the first read to the end of the request, so that a twin request, on this
    replica or another, is told the key is in flight instead of routing it too."""

    def __init__(self, registry: Registry, key: str, body: FederatedPlaceRequest) -> None:
        self.engine = registry.engine
        self.clock = registry.clock
        self.key = key
        self.request = request_text(body)
        self.holder = uuid.uuid4().hex
        deadline_s = body.federation.deadline_s
        self.until = self.clock() + timedelta(seconds=deadline_s + HOLD_MARGIN_S)
        self.recorded = False  # the row exists, held by this request

    def _in_flight(self) -> KeyInFlight:
        return KeyInFlight(
            "a request with this Idempotency-Key is being routed; retry it to get its answer",
            {"idempotency_key": self.key},
        )

    async def take(self) -> tuple[str, str] | None:
        """(region, GPU model) the key went to before, or None for a new key."""
        try:
            found = await off_loop(
                store.take_key,
                self.engine,
                self.key,
                self.holder,
                self.clock(),
                self.until,
                self.request,
                same_request,
            )
        except store.OtherRequest:
            raise Conflict(
                "this Idempotency-Key was used for a different request; use a new key",
                {"idempotency_key": self.key},
            ) from None
        except store.KeyHeld:
            raise self._in_flight() from None
        self.recorded = found is not None
        return found

    async def point(self, region: str, gpu_model: str) -> None:
        """Record that the key goes to ``region`` now, before it is sent there."""
        if self.recorded:
            done = await off_loop(
                store.move_key, self.engine, self.key, self.holder, region, gpu_model
            )
        else:
            done = await off_loop(
                store.hold_key,
                self.engine,
                self.key,
                region,
                gpu_model,
                self.holder,
                self.clock(),
                self.until,
                self.request,
            )
        if not done:
            raise self._in_flight()
        self.recorded = True

    async def drop(self) -> None:
        """Every region refused the key and holds nothing for it."""
        if self.recorded:
            await off_loop(store.drop_key, self.engine, self.key, self.holder)
            self.recorded = False

    async def let_go(self) -> None:
        if self.recorded:
            await off_loop(store.let_go_key, self.engine, self.key, self.holder)


async def place(
    registry: Registry,
    client: httpx.AsyncClient,
    body: FederatedPlaceRequest,
    key: str | None,
) -> dict[str, Any]:
    started = time.perf_counter()
    candidates = await ranked(registry, body)
    fitting = [c for c in candidates if c.fits]
    if key is None:
        return await _forward_in_turn(
            registry, client, body, None, None, fitting, candidates, started
        )
    hold = KeyHold(registry, key, body)
    recorded = await hold.take()
    if recorded is not None:
        # This key went there before: there first, where the allocation (if any) is, and
        # with the same GPU model, so the region sees the same request and replays it.
        region, model = recorded
        pinned = _pinned(region, model, candidates, body)
        fitting = [pinned] + [c for c in fitting if c.region != region]
    try:
        return await _forward_in_turn(
            registry, client, body, hold, recorded, fitting, candidates, started
        )
    finally:
        await hold.let_go()


async def _forward_in_turn(
    registry: Registry,
    client: httpx.AsyncClient,
    body: FederatedPlaceRequest,
    hold: KeyHold | None,
    recorded: tuple[str, str] | None,
    fitting: list[ranking.Candidate],
    candidates: list[ranking.Candidate],
    started: float,
) -> dict[str, Any]:
    """Forward to each region in turn until one places the job. ``recorded``: the first
    is where the key went before, which only its looking the key up frees."""
    key = hold.key if hold is not None else None
    gpus = body.gpus * body.tasks
    attempts: list[dict[str, Any]] = []
    forwards_s = 0.0
    deadline = started + body.federation.deadline_s
    for turn, chosen in enumerate(fitting):
        went_before = recorded is not None and turn == 0
        if time.perf_counter() >= deadline:
            _skip_late(chosen.region, went_before, body.federation.deadline_s, attempts)
            continue
        record = await _live_record(registry, chosen.region)
        if record is None:
            attempts.append(_attempt(chosen.region, None, "refused", "not a live region"))
            if went_before:
                # Its allocation, if any, is there still (a retired region's jobs run on).
                # Not no_region ("nothing fits now", Retry-After): the same key can never
                # be answered otherwise, so a dispatcher retrying it as told would be
                # refused for as long as the key is kept.
                raise RegionRetired(
                    f"region {chosen.region}, where this Idempotency-Key went before, is no"
                    " longer live: its allocation (if any) is there; send the job with a new"
                    " key to route it afresh",
                    {
                        "alternatives": [candidate_view(c, gpus) for c in candidates],
                        "attempts": attempts,
                    },
                )
            continue
        if chosen.cloud != record.cloud:  # a key's region this replica has not ranked yet
            chosen = replace(chosen, cloud=record.cloud)
        assert chosen.gpu_model is not None  # a fitting candidate is priced
        bad_url = region_url.problem(record.url)
        if bad_url is not None:  # stored before registration checked URLs this strictly
            registry.tell_bad_url(record, bad_url)
            attempts.append(_attempt(chosen.region, None, "skipped", bad_url))
            if went_before:
                raise _unusable_url(chosen.region, bad_url, attempts)
            continue
        # The forward is this request's write, in another region: a token revoked while
        # an earlier region hung (up to half of deadline_s) places nothing more, nor
        # points its key anywhere (service/edge/revoked_meanwhile.py).
        revoked_meanwhile.refuse_if_revoked()
        if hold is not None and not went_before:
            await hold.point(chosen.region, forward_model(body, chosen))
        # Checked again after the reads above: the key is held only until the deadline
        # (and a margin), and a forward sent past that may race a retry that took it.
        left = deadline - time.perf_counter()
        if left <= 0:
            _skip_late(chosen.region, went_before, body.federation.deadline_s, attempts)
            continue
        revoked_meanwhile.refuse_if_revoked()  # and while the key was pointed there
        sent_at = time.perf_counter()
        sent = forward_body(body, chosen)
        # At most half the deadline each: a region that hangs leaves time for the next.
        wait = min(left, body.federation.deadline_s / 2)
        asked = Asked(tasks=body.tasks, gpus=body.gpus)
        result = await forward(client, record.url, record.forward_token, sent, key, wait, asked)
        forwards_s += time.perf_counter() - sent_at
        attempts.append(_attempt(chosen.region, result.status, result.outcome, result.detail))
        if result.outcome is Outcome.PLACED:
            return _placed(chosen, result, candidates, attempts, gpus, started, forwards_s)
        if hold is not None and not _key_moves_on(result, went_before):
            raise _kept_there(chosen.region, result, went_before, attempts)
    if hold is not None:
        await hold.drop()  # every region refused it, holding nothing for it
    views = [candidate_view(c, gpus) for c in candidates]
    raise NoRegion(
        "no region can place this job now: "
        + ("every region that fit refused it" if fitting else "none fits (see alternatives)"),
        {"alternatives": views, "attempts": attempts},
    )


def _key_moves_on(result: Forwarded, pinned: bool) -> bool:
    """Whether a keyed job may leave the region after this answer: only when the region
    holds no allocation for the key. A region the key went to before may hold one made
    then (its answer lost), so only its looking the key up and finding nothing frees it.
    A first forward also moves on when nothing was sent, or the region turned the
    request away before placing (a 4xx other than the key's own conflicts). A 5xx may
    come after a commit that landed (the region's database lost the answer, a proxy
    timed out): the key stays, and its retry gets that allocation."""
    if result.outcome is Outcome.REFUSED and LOOKED_UP.get(result.code or "") == result.status:
        return True
    if pinned:
        return False
    if result.outcome is Outcome.UNREACHABLE:
        return True
    if result.outcome is Outcome.REFUSED:
        assert result.status is not None
        return result.status < 500 and result.code not in KEY_IN_USE
    return False


def _kept_there(
    region: str, result: Forwarded, pinned: bool, attempts: list[dict[str, Any]]
) -> ServiceError:
    """The answer to a keyed job whose key stays in ``region``: the region's own word on
    the key when it gave one, else try again later with the same key."""
    detail = {"region": region, "attempts": attempts}
    if result.code == KeyInFlight.code:
        return KeyInFlight(
            f"region {region} is committing a request with this Idempotency-Key; retry it"
            " to get its answer",
            detail,
        )
    if result.code == Conflict.code:
        return Conflict(
            f"this Idempotency-Key was used for a different request in region {region};"
            " use a new key",
            detail,
        )
    if pinned:
        said = "did not answer" if result.outcome is not Outcome.REFUSED else "refused"
        return RegionUnavailable(
            f"region {region}, where this Idempotency-Key went before, {said} ({result.detail})"
            " and may hold its allocation: retry later with the same key",
            detail,
        )
    return RegionUnavailable(
        f"region {region} took the request but its answer ({result.detail}) does not say"
        " whether it reserved: retry with the same Idempotency-Key (it goes to the same"
        " region)",
        detail,
    )


def _skip_late(
    region: str, went_before: bool, deadline_s: float, attempts: list[dict[str, Any]]
) -> None:
    """A region not asked because the deadline passed first."""
    attempts.append(_attempt(region, None, "skipped", "the deadline passed"))
    if went_before:
        # Never asked, the key's region may hold its allocation: the key stays there
        # (dropped, the next retry would reserve again elsewhere).
        raise _not_asked(region, deadline_s, attempts)


def _not_asked(region: str, deadline_s: float, attempts: list[dict[str, Any]]) -> RegionUnavailable:
    """The answer to a keyed retry whose deadline passed before its key's region was asked."""
    return RegionUnavailable(
        f"region {region}, where this Idempotency-Key went before, was not asked: the"
        f" request's deadline_s ({deadline_s:g} s) passed first; it may hold its allocation:"
        " retry with the same key",
        {"region": region, "attempts": attempts},
    )


def _unusable_url(region: str, problem: str, attempts: list[dict[str, Any]]) -> RegionUnavailable:
    """The answer to a keyed retry whose key's region has a stored URL that takes no
    forwards. A URL with credentials in it did take them: the region may hold the
    allocation, so the key stays there, as for a region down."""
    return RegionUnavailable(
        f"region {region}, where this Idempotency-Key went before, cannot be forwarded to:"
        f" {problem}; it may hold its allocation: retry with the same key once its URL is"
        " set right",
        {"region": region, "attempts": attempts},
    )


async def _live_record(registry: Registry, region: str) -> RegionRecord | None:
    """The region's record when it is live now, with its URL and forward token as stored
    now. The registry learns another replica's registration, retirement or update only
    when it next reads the table; the database is asked before each forward, so a
    retired region is never forwarded to, whichever replica retired it, a key goes back
    to its region whichever replica registered it, and to the URL last set."""
    record = registry.record(region)
    if record is None:
        # Registered on another replica since this one last read the table (a key sent
        # there, retried here): the database knows it.
        found = await off_loop(store.get, registry.engine, region)
        if found is None or found.retired_at is not None:
            return None
        registry.invalidate()  # the next request reads the table before it ranks
        return found
    target = await off_loop(store.forward_target, registry.engine, region)
    if target is None:
        registry.invalidate()  # the next request reads the table before it ranks
        return None
    if (record.url, record.forward_token) != target:
        # Set again on another replica (PATCH /v1/regions/{region}): this registry hears
        # of it only when the region's summary moves, and a forward to the old URL is
        # what the update was made to stop.
        registry.invalidate()
        return replace(record, url=target[0], forward_token=target[1])
    return record


def _attempt(region: str, status: int | None, outcome: str, detail: str) -> dict[str, Any]:
    return {"region": region, "outcome": str(outcome), "status": status, "detail": detail}


def _placed(
    chosen: ranking.Candidate,
    result: Forwarded,
    candidates: list[ranking.Candidate],
    attempts: list[dict[str, Any]],
    gpus: int,
    started: float,
    forwards_s: float,
) -> dict[str, Any]:
    allocation = result.body or {}
    tasks = allocation.get("tasks", [])
    nodes = [t["node"] for t in tasks]
    total_s = time.perf_counter() - started
    return {
        "region": chosen.region,
        "cloud": chosen.cloud,
        "node": nodes[0] if nodes else "",
        "nodes": nodes,
        "gpus": [u for t in tasks for u in t.get("gpu_uuids", [])],
        "allocation": allocation,
        "replayed": result.replayed,
        "design": chosen.design,
        "gpu_model": chosen.gpu_model,
        "predicted_gbps": chosen.predicted_gbps,
        "cost": cost_view(chosen, gpus) or cost_view(_free(chosen), gpus),
        "alternatives": [candidate_view(c, gpus) for c in candidates if c.region != chosen.region],
        "attempts": attempts,
        "timings_ms": {
            "routing": round((total_s - forwards_s) * 1000, 3),
            "forwards": round(forwards_s * 1000, 3),
        },
    }


def _free(c: ranking.Candidate) -> ranking.Candidate:
    """A replay to a region the ranking no longer fits: its cost is not predicted now."""
    return ranking.Candidate(
        c.region, c.cloud, True, c.reason, cost=ranking.Cost(0.0, False, 0.0, 0.0, 0.0)
    )
