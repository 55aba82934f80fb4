"""Forgetting where old Idempotency-Keys went: ``federation_forwards`` rows past retention.

Every keyed ``/v1/federation/place`` leaves a row naming the region its key went
to, so that a retry goes there and gets the region's own replay. Kept forever,
the table grew with every keyed job. A row goes once its key was first forwarded
more than ``TOPOPLACE_FEDERATION_FORWARD_RETENTION_S`` ago (a week by default)
and no request holds it; a retry of the key after that is a new key, routed
afresh (docs/federation.md, "Idempotency").

The background loop calls :func:`prune`: one batch a call, so that a backlog (the
first run over a table that was never pruned) is taken a batch at a time between
the loop's other work (expiring reservations) rather than in one long delete; a
full batch means more are due at once, else the next round is an interval away.
"""

from __future__ import annotations

from datetime import timedelta

from service import prune_rounds
from service.federation import store
from service.state import ServiceState

PRUNE_BATCH = 1000  # rows a statement: a few milliseconds, no long hold on the table
PRUNE_INTERVAL_S = 60.0  # between rounds once no backlog is left


def prune(state: ServiceState) -> int:
    """Forget one batch of keys past retention; how many went."""
    now = state.clock()
    before = now - timedelta(seconds=state.settings.federation_forward_retention_s)
    return store.forget_keys(state.engine, before, now, PRUNE_BATCH)


def wait_after(pruned: int) -> float:
    """Seconds to the next round (service/prune_rounds.py)."""
    return prune_rounds.wait_after(pruned, PRUNE_BATCH, PRUNE_INTERVAL_S)
