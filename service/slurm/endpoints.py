"""HTTP routes for the Slurm adapter (job_submit.lua, cli_filter.lua, cron)."""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import parse_qsl

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import TypeAdapter, ValidationError

from service.access import flagged, query_of
from service.deps import get_state
from service.edge.idempotency_header import KEY_LENGTH, idempotency_key
from service.errors import BadRequest, InvalidRequest
from service.event_loop import off_loop
from service.responses import FastJSON
from service.slurm import json_command, pushed, reconcile, service, truth
from service.slurm.schemas import (
    JobDecision,
    JobStarted,
    JobStartedResult,
    JobSubmit,
    ReconcileResult,
)
from service.slurm.settings import SlurmSettings
from service.state import ServiceState

router = APIRouter(prefix="/v1/slurm", tags=["slurm"])
State = Annotated[ServiceState, Depends(get_state)]


async def get_settings(request: Request) -> SlurmSettings:
    # Read once per application, on first use: a service without Slurm never reads them.
    # async: a plain function would cost a thread hop on every submission.
    settings: SlurmSettings | None = getattr(request.app.state, "slurm_settings", None)
    if settings is None:
        settings = SlurmSettings()
        request.app.state.slurm_settings = settings
    return settings


Settings = Annotated[SlurmSettings, Depends(get_settings)]


async def handle_job_submit(request: Request) -> Response:
    """The job-submit call as served (``service.direct_routes``, before FastAPI's router):
    read the body into a JobSubmit, hand it to the endpoint with the state and the Slurm
    settings. slurmctld waits on this call with its job write lock held, once per
    submission; FastAPI's general request handling (dependency solving, body reading and
    validation, response handling) cost 0.5-1.0 ms of a 1.2-2.4 ms call made after idle."""
    try:
        job = JobSubmit.model_validate_json(await request.body())
    except ValidationError as exc:
        # Answered in the one error shape, as for any route.
        raise RequestValidationError(exc.errors(include_url=False)) from None
    propose = proposing(query_of(request.scope))
    key = idempotency_key(request)
    state, settings = await get_state(request), await get_settings(request)
    return await job_submit(job, state, settings, propose, key)


# pydantic's strings for a boolean: ``propose`` is documented as one.
_BOOLEAN = frozenset({"0", "off", "f", "false", "n", "no", "1", "on", "t", "true", "y", "yes"})


def proposing(query: str) -> bool:
    """Whether ``?propose=`` is given and not false: the same reading as the access rule's,
    which let a read-only token through for it (any value true, repeated ones included).
    A value that is no boolean is refused (422), as the document states it."""
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key == "propose" and value.strip().lower() not in _BOOLEAN:
            raise RequestValidationError(
                [
                    {
                        "type": "bool_parsing",
                        "loc": ("query", "propose"),
                        "msg": "Input should be a valid boolean",
                        "input": value,
                    }
                ]
            )
    return flagged(query, "propose")


@router.post("/job-submit", response_model=JobDecision)
async def job_submit(
    body: JobSubmit,
    state: State,
    settings: Settings,
    propose: Annotated[
        bool,
        Query(
            description="only say what would be chosen, whatever the body's `reserve`: a"
            " read-only (viewer) token may ask this (cli_filter.lua, run as the user)"
        ),
    ] = False,
    idempotency_key: Annotated[
        str | None,
        Header(
            **KEY_LENGTH,
            description="one per submission (job_submit.lua sends one): the same submission"
            " sent again, after its connection closed with no answer, is answered with the"
            " reservations the first made, not a second set",
        ),
    ] = None,
) -> FastJSON:
    """Place a job as Slurm's job_submit.lua sees it: the job_desc fields to write
    (exact nodes and GPUs), leave it to Slurm (with the reason), or refuse it.

    Allocations are made active at once: Slurm owns the job from the answer on, and
    the epilog or the reconcile loop ends them."""
    if propose:
        body = body.model_copy(update={"reserve": False})
    decision = await service.decide(state, settings, body, idempotency_key)
    return FastJSON(decision.model_dump(mode="json"))


# Served before FastAPI's router (service.direct_routes); the route above documents it.
DIRECT = {("POST", f"{router.prefix}/job-submit"): handle_job_submit}


# What reconcile reads of squeue's output, stated in the document: the body is read raw
# (below), as JSON, the rest of it ignored; described as FastAPI described the
# dict[str, Any] body it decoded before.
_SQUEUE_BODY = {
    "requestBody": {
        "content": {
            "application/json": {
                "schema": {
                    "additionalProperties": True,
                    "description": "the output of `squeue --json`",
                    "properties": {"jobs": {"type": "array"}},
                    "required": ["jobs"],
                    "title": "Squeue",
                    "type": "object",
                }
            }
        },
        "required": True,
    }
}
_OBJECT: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


async def squeue_answer(request: Request) -> dict[str, Any]:
    """The pushed squeue answer, decoded on a worker thread (json_command.parsed): a whole
    queue is megabytes (3.2-4.1 KB a job), and FastAPI decoded a dict[str, Any] body on
    the event loop, every other request of the process waiting (a 20 MB push: 125 ms of
    json.loads, after 330 ms of the guard's depth scan, which this route makes piece by
    piece instead). Refused as FastAPI refused it: nothing (422 missing), a Content-Type
    other than JSON or a document that is no object (422 dict_type), no JSON (422
    json_invalid, at its position), undecodable text (400)."""
    raw = await request.body()
    if not raw:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise RequestValidationError([missing])
    document: Any = raw
    if _is_json(request.headers.get("content-type")):
        try:
            document = await json_command.parsed(raw)
        except json_command.TooDeep as exc:  # the guard's answer to other routes' bodies
            raise InvalidRequest("body", str(exc)) from None
        except json.JSONDecodeError as exc:
            where = {"loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
            raise RequestValidationError([{"type": "json_invalid", **where}]) from None
        except ValueError as exc:  # not UTF-8/16/32; a number of too many digits
            raise HTTPException(400, "There was an error parsing the body") from exc
    try:
        return _OBJECT.validate_python(document)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in errors]) from None


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI would decode a body so labelled: application/json or +json."""
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    main, _, sub = media.partition("/")
    return main == "application" and (sub == "json" or sub.endswith("+json"))


@router.post("/reconcile", response_model=ReconcileResult, openapi_extra=_SQUEUE_BODY)
async def post_reconcile(
    squeue: Annotated[dict[str, Any], Depends(squeue_answer)],
    state: State,
    settings: Settings,
    read_at: Annotated[
        float | None,
        Query(
            ge=0,
            allow_inf_nan=False,
            description="Unix seconds (a fraction allowed) when this squeue started, by the"
            " pusher's clock (`date +%s.%N` before squeue): the answer counts as taken then;"
            " one after its arrival (a clock ahead) counts as none; more than"
            f" {pushed.AHEAD_S:g} s ahead of"
            f" the service's clock or {pushed.OLDEST_S:g} s behind it is refused (422)."
            " Without it the answer counts as taken TOPOPLACE_SLURM_SQUEUE_TIMEOUT_S (20 s by"
            " default) before its arrival, so an allocation made since then is not released"
            " on it",
        ),
    ] = None,
) -> ReconcileResult:
    """Release allocations made for Slurm jobs that `squeue --json` no longer lists as live."""
    # The moment the answer was taken: a pushed one arrives after squeue has finished.
    taken_at = pushed.taken_at(state.clock(), read_at, settings)
    # Off the loop as before (this was a plain def route): it reads and writes the database.
    return await off_loop(reconcile.reconcile, state, settings, squeue, taken_at)


@router.post("/job-started", response_model=JobStartedResult)
def job_started(body: JobStarted, state: State) -> JobStartedResult:
    """A job started (the prolog): record the node(s) and GPUs Slurm really gave it.

    Its allocation is kept, moved onto those GPUs or created, and learns the job id;
    any other allocation holding them is stale and released (docs/slurm.md)."""
    try:
        job, job_state = truth.from_show_job(body.show_job, body.job_name)
    except (truth.TruthError, ValueError) as exc:
        raise BadRequest(str(exc), {"field": "show_job"}) from None
    if job_state in reconcile.FINISHED or job_state == reconcile.COMPLETING:
        # Read after the job ended (a late or repeated report), or as it was leaving its
        # GPUs (cancelled while its prolog ran): the job holds nothing, and recording it
        # would take the GPUs of whichever job has them now (a requeued run's report is
        # not held to the end remembered). The reconcile loop records neither.
        return JobStartedResult(
            action="none",
            job_id=job.job_id,
            message=f"job {job.job_id} has ended (JobState={job_state}): nothing recorded",
        )
    # Read as the job started, but perhaps processed after its end (a retry, a slow
    # network): a job whose end was said already is not brought back (docs/slurm.md).
    observation = truth.record(state, truth.users_own(state, job), started=True)
    if observation is None:
        return JobStartedResult(
            action="none",
            job_id=job.job_id,
            message=f"job {job.job_id} runs on no GPU of a node topoplace knows",
        )
    if observation.action == "ended":
        return JobStartedResult(
            action="none",
            job_id=job.job_id,
            message=f"job {job.job_id} has ended already (its epilog or the reconcile loop"
            " released it): this report of its start came after it, nothing recorded",
        )
    return JobStartedResult(
        action=observation.action,
        job_id=job.job_id,
        allocation_id=observation.allocation_id,
        superseded=list(observation.superseded),
        merged=list(observation.merged),
    )
