"""Keeping the audit log to its retention: old rows deleted in batches, from the background loop."""

from __future__ import annotations

from datetime import timedelta

from service.audit import store
from service.state import ServiceState

PRUNE_BATCH = 5000  # rows a transaction: a long delete would hold up the writers


def prune(state: ServiceState) -> int:
    """Delete the rows older than TOPOPLACE_AUDIT_RETENTION_DAYS (none when 0); how many."""
    days = state.settings.audit_retention_days
    if days <= 0:
        return 0
    return store.prune(state.engine, state.clock() - timedelta(days=days), PRUNE_BATCH)
