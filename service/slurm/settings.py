"""Settings of the Slurm adapter: TOPOPLACE_SLURM_* environment variables.

Kept apart from the service's own settings: a service that serves no Slurm
cluster never reads them.
"""

from __future__ import annotations

import shutil

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from placement.request import Locality, NumaMode, Objective, Policy
from service.duration_bound import DurationBound


class SlurmSettings(DurationBound):
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
        default="auto",
        description="command printing `squeue --json` for the reconcile loop; 'auto': "
        " 'squeue --json' where squeue is on PATH, else no loop; empty or 'off': no loop"
        " (POST /v1/slurm/reconcile still works)",
    )
    reconcile_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="how often the loop reads squeue: a job cancelled while pending (no"
        " epilog runs) is released within one interval",
    )
    reconcile_grace_s: float = Field(
        default=0.5,
        ge=0,
        description="an allocation no job names is released once this old: the job it was"
        " made for may not exist yet for this long; must exceed what job_submit.lua waits"
        " for an answer (its timeout_ms, per step)",
    )
    squeue_timeout_s: float = Field(default=20.0, gt=0)
    sinfo_command: str = Field(
        default="auto",
        description="command printing `sinfo --json`, read for the nodes Slurm starts no job on"
        " (down, drained or draining, failed, maintenance, not responding), which the filter"
        " then leaves out; 'auto': 'sinfo --json' where sinfo is on PATH; empty or 'off': none",
    )
    nodes_interval_s: float = Field(
        default=1.0, gt=0, description="how often the node states are read (sinfo_command)"
    )
    sinfo_timeout_s: float = Field(default=5.0, gt=0)

    def command(self) -> str:
        """The squeue command the loop runs, or '' for none."""
        if self.squeue_command == "auto":
            return "squeue --json" if shutil.which("squeue") else ""
        return "" if self.squeue_command == "off" else self.squeue_command

    def sinfo(self) -> str:
        """The sinfo command the node states are read with, or '' for none."""
        if self.sinfo_command == "auto":
            return "sinfo --json" if shutil.which("sinfo") else ""
        return "" if self.sinfo_command == "off" else self.sinfo_command
