"""The admin comment the filter writes on a job, and reading the allocation ids back.

``topoplace alloc=<id>[,<id>...] ring=<GB/s> bandwidth=<0..1> gpus=<indices>``:
the epilog and the reconcile loop find a job's allocations here (a job has
no id yet when job_submit runs, so the allocation cannot carry it).
"""

from __future__ import annotations

import re

_IDS = re.compile(r"\btopoplace alloc=([0-9A-Za-z,-]+)")


def format_comment(ids: list[str], ring_gbps: float, bandwidth: float, gpus: list[int]) -> str:
    return (
        f"topoplace alloc={','.join(ids)} ring={ring_gbps:g}GB/s"
        f" bandwidth={bandwidth:.2f} gpus={','.join(str(g) for g in gpus)}"
    )


def allocation_ids(text: str | None) -> list[str]:
    """Allocation ids named in an admin comment (none when it has no topoplace part)."""
    match = _IDS.search(text or "")
    return [i for i in match.group(1).split(",") if i] if match else []
