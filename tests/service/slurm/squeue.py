"""What the reconcile tests share: jobs as `squeue --json` prints them, a reconcile tick
whose squeue read the test chooses, and the allocations still held."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.slurm import reconcile as reconcile_module
from service.slurm.reconcile import Reconciler
from service.slurm.settings import SlurmSettings
from tests.service.conftest import FakeClock

ReadSqueue = Callable[[str, float], Awaitable[dict[str, Any]]]


def pending(job: int, comment: str, reason: str, description: str = "") -> dict[str, Any]:
    """A pending job as Slurm 22.05.8's `squeue --json` prints it (fields read here)."""
    return {
        "job_id": job,
        "job_state": "PENDING",
        "state_reason": reason,
        "state_description": description,
        "admin_comment": comment,
    }


def running(job: int, comment: str, gres_detail: list[str]) -> dict[str, Any]:
    """alice's job running on node1, as Slurm 22.05.8's `squeue --json` prints it (fields
    read here)."""
    return {
        "job_id": job,
        "job_state": "RUNNING",
        "user_name": "alice",
        "nodes": "node1",
        "gres_detail": gres_detail,
        "admin_comment": comment,
    }


def read_now(clock: FakeClock) -> dict[str, float]:
    """POST /v1/slurm/reconcile's parameters for an answer whose squeue started at the
    clock's now (without them a pushed answer counts as taken 20 s before it came)."""
    return {"read_at": clock.now.timestamp()}


def live(client: TestClient) -> list[str]:
    rows = client.get("/v1/allocations").json()["allocations"]
    return [a["id"] for a in rows if a["state"] in ("pending", "active")]


def tick_reading(client: TestClient, monkeypatch: pytest.MonkeyPatch, read: ReadSqueue) -> None:
    """One reconcile tick (a grace of 0.5 s) whose squeue read is ``read``: a slow one,
    during which the test changes what the answer it returns will be older than."""
    monkeypatch.setattr(reconcile_module, "read_squeue", read)
    app: Any = client.app
    settings = SlurmSettings(squeue_command="squeue --json", reconcile_grace_s=0.5)
    asyncio.run(Reconciler(app.state.service, settings).tick())
