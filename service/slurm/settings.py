"""Settings of the Slurm adapter: TOPOPLACE_SLURM_* environment variables.

Kept apart from the service's own settings: a service that serves no Slurm
cluster never reads them.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from placement.request import Locality, NumaMode, Objective, Policy


class SlurmSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOPOPLACE_SLURM_", extra="ignore")

    locality: Locality = Field(
        default="prefer", description="locality of jobs that do not choose one in their comment"
    )
    policy: Policy = "pack"
    objective: Objective = "performance"
    numa: NumaMode = "preferred"
    allow_opt_out: bool = Field(
        default=True, description="honour 'topoplace:off' in a job's comment (Slurm alone)"
    )
    squeue_command: str = Field(
        default="",
        description="command printing `squeue --json` for the reconcile loop, e.g."
        " 'squeue --json'; empty: no loop (POST /v1/slurm/reconcile still works)",
    )
    reconcile_interval_s: float = Field(default=30.0, gt=0)
    reconcile_grace_s: float = Field(
        default=60.0,
        ge=0,
        description="allocations younger than this are never reconciled: the job they were"
        " made for may not be in squeue's answer yet",
    )
    squeue_timeout_s: float = Field(default=20.0, gt=0)
