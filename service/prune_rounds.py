"""When the background loop prunes again: at once after a full batch, else an interval on.

Pruning past retention (the audit log, forwarded federation keys) takes one batch
per round of the background loop, so that a backlog (a service stopped for weeks, a
retention shortened) is taken a batch at a time between the loop's other work
(expiring reservations, the Slurm reconcile) instead of one delete after another
that holds the loop until the whole backlog is gone.
"""

from __future__ import annotations


def wait_after(pruned: int, batch: int, interval_s: float) -> float:
    """Seconds to the next round: none after a full batch (more may be due), else
    ``interval_s``."""
    return 0.0 if pruned >= batch else interval_s
