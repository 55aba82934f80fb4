"""HTTP routes for the Slurm adapter (job_submit.lua, cli_filter.lua, cron)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request

from service.deps import get_state
from service.responses import FastJSON
from service.slurm import reconcile, service
from service.slurm.schemas import JobDecision, JobSubmit, ReconcileResult
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


@router.post("/job-submit", response_model=JobDecision)
async def job_submit(body: JobSubmit, state: State, settings: Settings) -> FastJSON:
    """Place a job as Slurm's job_submit.lua sees it: the job_desc fields to write
    (exact nodes and GPUs), leave it to Slurm (with the reason), or refuse it.

    Allocations are made active at once: Slurm owns the job from the answer on, and
    the epilog or the reconcile loop ends them."""
    decision = await service.decide(state, settings, body)
    return FastJSON(decision.model_dump(mode="json"))


@router.post("/reconcile", response_model=ReconcileResult)
def post_reconcile(
    squeue: Annotated[dict[str, Any], Body(description="the output of `squeue --json`")],
    state: State,
    settings: Settings,
) -> ReconcileResult:
    """Release allocations made for Slurm jobs that `squeue --json` no longer lists as live."""
    return reconcile.reconcile(state, settings, squeue)
