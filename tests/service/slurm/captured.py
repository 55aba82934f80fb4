"""A real `squeue --json` answer, and queues of any size made from it (no fixtures
imported: bench/reconcile_push.py uses it too)."""

from __future__ import annotations

import json
from pathlib import Path

# Slurm 22.05.8's `squeue --json`, captured on the loopback cluster (tests/integrations/
# slurm/): a running job placed by the filter and a pending one, as squeue prints them.
CAPTURED = Path(__file__).with_name("squeue-22.05.json")


def pending_queue(size: int) -> tuple[bytes, int]:
    """A `squeue --json` answer of at least ``size`` bytes, and how many jobs it lists: the
    captured pending job (3.2 KB as squeue prints it) again and again, each with its own
    job id. Pending jobs name no GPUs, so a reconcile of them records nothing."""
    answer = json.loads(CAPTURED.read_text())
    job = next(j for j in answer["jobs"] if j["job_state"] == "PENDING")

    def printed(count: int) -> bytes:
        jobs = [{**job, "job_id": 1000 + i} for i in range(count)]
        return json.dumps({**answer, "jobs": jobs}, indent=2).encode()

    each = len(printed(2)) - len(printed(1))
    count = 1 + max(0, -(-(size - len(printed(1))) // each))
    return printed(count), count
