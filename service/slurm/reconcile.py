"""Release allocations of jobs Slurm no longer has, so nothing leaks when an epilog is missed.

Slurm's view comes from ``squeue --json`` (run by the service where
``TOPOPLACE_SLURM_SQUEUE_COMMAND`` is set, or pushed to POST
/v1/slurm/reconcile by a cron job on a host that has the Slurm client).
An allocation made by the filter (owner ``slurm:<user>``) is live while a
job that is not finished names it in its admin comment. Allocations younger
than the grace period are left alone: the job they were made for may not be
in that answer yet (the filter reserves before slurmctld creates the job).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shlex
import subprocess
import time
from datetime import datetime, timedelta
from typing import Any

from service.allocations import service as allocations
from service.errors import BadRequest
from service.slurm.admin_comment import allocation_ids
from service.slurm.schemas import ReconcileResult
from service.slurm.service import OWNER_PREFIX
from service.slurm.settings import SlurmSettings
from service.state import ServiceState

log = logging.getLogger("topoplace.slurm")

# Job states after which a job holds nothing (squeue keeps showing such jobs for MinJobAge).
FINISHED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)
_LISTED = 10_000


def _states(job: dict[str, Any]) -> set[str]:
    value = job.get("job_state")
    # API v0.0.38 gives a string, later ones a list of flags.
    values = value if isinstance(value, list) else [value]
    return {str(v).upper() for v in values if v}


def live_allocations(squeue: Any) -> tuple[set[str], int]:
    """(allocation ids named by unfinished jobs, how many such jobs)."""
    if not isinstance(squeue, dict) or not isinstance(squeue.get("jobs"), list):
        raise BadRequest("expected the output of `squeue --json`: an object with a 'jobs' list")
    live: set[str] = set()
    jobs = 0
    for job in squeue["jobs"]:
        if not isinstance(job, dict) or _states(job) & FINISHED:
            continue
        ids = allocation_ids(str(job.get("admin_comment") or ""))
        if ids:
            live.update(ids)
            jobs += 1
    return live, jobs


def reconcile(state: ServiceState, settings: SlurmSettings, squeue: Any) -> ReconcileResult:
    live, jobs = live_allocations(squeue)
    cutoff = state.clock() - timedelta(seconds=settings.reconcile_grace_s)
    released: list[str] = []
    for status in ("active", "pending", "degraded"):
        for allocation in allocations.listing(state, None, None, status, _LISTED):
            if not str(allocation["owner"] or "").startswith(OWNER_PREFIX):
                continue
            created = datetime.fromisoformat(str(allocation["created_at"]))
            if allocation["id"] in live or created > cutoff:
                continue
            released += allocations.release(state, str(allocation["id"]))
    if released:
        log.info("reconcile: released %d allocation(s) of jobs Slurm no longer has", len(released))
    return ReconcileResult(released=released, live_jobs=jobs)


def read_squeue(command: str, timeout_s: float) -> Any:
    """Run the configured command and parse its JSON; raises RuntimeError saying what failed."""
    try:
        done = subprocess.run(
            shlex.split(command), capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{command!r} failed: {exc}") from exc
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[:300]
        raise RuntimeError(f"{command!r} exited {done.returncode}: {err}")
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise RuntimeError(f"{command!r} printed no JSON: {exc}") from exc


class Reconciler:
    """The background loop's Slurm step: every interval, when a squeue command is set."""

    def __init__(self, state: ServiceState, settings: SlurmSettings | None = None) -> None:
        self.state = state
        self.settings = settings or SlurmSettings()
        self._next = 0.0

    async def tick(self) -> None:
        command = self.settings.squeue_command
        if not command or time.monotonic() < self._next:
            return
        self._next = time.monotonic() + self.settings.reconcile_interval_s
        try:
            squeue = await asyncio.to_thread(read_squeue, command, self.settings.squeue_timeout_s)
        except RuntimeError as exc:
            # Never release on a failed read: an empty answer would free every GPU.
            log.warning("reconcile skipped: %s", exc)
            return
        await asyncio.to_thread(reconcile, self.state, self.settings, squeue)
