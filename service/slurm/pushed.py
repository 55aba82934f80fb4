"""When a pushed ``squeue --json`` answer was taken (POST /v1/slurm/reconcile).

The reconcile's guards (reconcile.py) read an answer as taken when squeue
started: a job submitted or reported after that moment is missing from it and
must keep its GPUs. The loop knows that moment; a pushed answer arrives once
squeue has finished (``squeue --json | curl ...``), seconds later on a busy
controller, so its arrival is too late a moment to count from. The pusher says
when its read started (``read_at``); without it the answer is taken as old as
the slowest squeue the service itself would wait for. Only the service's clock
is trusted to move the moment later: an earlier one is only more cautious.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from service.errors import InvalidRequest
from service.slurm.settings import SlurmSettings

# The parameter as the request names it (and the refusal's ``field``).
FIELD = "query.read_at"
# Clocks of the cron host and the service differ by this much at most: a read_at
# further ahead is no time it could have started (milliseconds given for seconds,
# a clock far off), and is refused rather than quietly read as the arrival.
AHEAD_S = 60.0
# No squeue read takes this long (the loop gives its own squeue_timeout_s, 20 s):
# an older read_at is the wrong number (another clock, another unit, a job's start),
# refused rather than applied.
OLDEST_S = 3600.0


def taken_at(now: datetime, read_at: float | None, settings: SlurmSettings) -> datetime:
    """The moment a pushed answer counts as taken, ``now`` being its arrival.

    ``read_at`` (Unix seconds, from the pusher's clock): when its squeue started;
    min(read_at, now), a read_at up to ``AHEAD_S`` ahead being a clock ahead of ours.
    None: ``now`` less ``squeue_timeout_s``, so that a squeue as slow as the one the
    service would run itself cannot make a live job's reservation look orphaned.
    Raises InvalidRequest (422) for a value that cannot be when a read started."""
    if read_at is None:
        return now - timedelta(seconds=min(settings.squeue_timeout_s, OLDEST_S))
    if not math.isfinite(read_at) or read_at < 0:
        # The route refuses these already (its Query's bounds); checked here for any caller.
        raise InvalidRequest(FIELD, "must be a finite number of Unix seconds, 0 or more")
    arrival = now.timestamp()
    if read_at > arrival + AHEAD_S:
        raise InvalidRequest(
            FIELD,
            f"{read_at - arrival:.3f} s after the service's clock (at most {AHEAD_S:g} s"
            " ahead is read as now): Unix seconds when squeue started, e.g. date +%s.%N",
        )
    if read_at < arrival - OLDEST_S:
        raise InvalidRequest(
            FIELD,
            f"{arrival - read_at:.3f} s before the service's clock (at most {OLDEST_S:g} s):"
            " Unix seconds when squeue started, e.g. date +%s.%N",
        )
    return min(now, datetime.fromtimestamp(read_at, UTC))
