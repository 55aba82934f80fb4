"""Keeping the audit log to its retention: old rows deleted a batch a round of the
background loop (service/prune_rounds.py), so that a backlog never holds up the
loop's expiry sweep and Slurm reconcile."""

from __future__ import annotations

from datetime import timedelta

from service import prune_rounds
from service.audit import store
from service.state import ServiceState

PRUNE_BATCH = 5000  # rows a transaction: a long delete would hold up the writers


def prune(state: ServiceState) -> int:
    """Delete one batch of the rows older than TOPOPLACE_AUDIT_RETENTION_DAYS (none when
    0); how many went."""
    days = state.settings.audit_retention_days
    if days <= 0:
        return 0
    return store.prune(state.engine, state.clock() - timedelta(days=days), PRUNE_BATCH)


def wait_after(state: ServiceState, pruned: int) -> float:
    """Seconds to the next round: none while a backlog is left, else
    TOPOPLACE_AUDIT_PRUNE_INTERVAL_S."""
    return prune_rounds.wait_after(pruned, PRUNE_BATCH, state.settings.audit_prune_interval_s)
