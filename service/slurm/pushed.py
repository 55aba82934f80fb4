"""When a pushed ``squeue --json`` answer was taken (POST /v1/slurm/reconcile).

The reconcile's guards (reconcile.py) read an answer as taken when squeue
started: a job submitted or reported after that moment is missing from it and
must keep its GPUs. The loop knows that moment; a pushed answer arrives once
squeue has finished (``squeue --json | curl ...``), seconds later on a busy
controller, so its arrival is too late a moment to count from. The pusher says
when its read started (``read_at``); without it the answer is taken as old as
the slowest squeue the service itself would wait for. Only the service's clock
is trusted to move the moment later: an earlier one is only more cautious. A
read_at after the arrival comes from a clock that runs ahead: it says nothing of
when squeue started, and the arrival is too late a moment, so it counts as none.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime, timedelta

from service.errors import InvalidRequest
from service.slurm.settings import SlurmSettings

log = logging.getLogger("topoplace.slurm")
# The parameter as the request names it (and the refusal's ``field``).
FIELD = "query.read_at"
# Clocks of the cron host and the service differ by this much at most: a read_at
# further ahead is no time it could have started (milliseconds given for seconds,
# a clock far off), and is refused rather than quietly read as none.
AHEAD_S = 60.0
# No squeue read takes this long (the loop gives its own squeue_timeout_s, 20 s):
# an older read_at is the wrong number (another clock, another unit, a job's start),
# refused rather than applied.
OLDEST_S = 3600.0


def taken_at(now: datetime, read_at: float | None, settings: SlurmSettings) -> datetime:
    """The moment a pushed answer counts as taken, ``now`` being its arrival.

    ``read_at`` (Unix seconds, from the pusher's clock): when its squeue started.
    None: ``now`` less ``squeue_timeout_s``, so that a squeue as slow as the one the
    service would run itself cannot make a live job's reservation look orphaned. A
    read_at after ``now`` (up to ``AHEAD_S``) is a clock ahead of ours, by an unknown
    amount: counted as None, since the arrival would release the reservation of a job
    submitted while a squeue slower than the grace period ran.
    Raises InvalidRequest (422) for a value that cannot be when a read started."""
    slowest = now - timedelta(seconds=min(settings.squeue_timeout_s, OLDEST_S))
    if read_at is None:
        return slowest
    if not math.isfinite(read_at) or read_at < 0:
        # The route refuses these already (its Query's bounds); checked here for any caller.
        raise InvalidRequest(FIELD, "must be a finite number of Unix seconds, 0 or more")
    arrival = now.timestamp()
    if read_at > arrival + AHEAD_S:
        raise InvalidRequest(
            FIELD,
            f"{read_at - arrival:.3f} s after the service's clock (at most {AHEAD_S:g} s"
            " ahead is read as no read_at): Unix seconds when squeue started, e.g. date +%s.%N",
        )
    if read_at < arrival - OLDEST_S:
        raise InvalidRequest(
            FIELD,
            f"{arrival - read_at:.3f} s before the service's clock (at most {OLDEST_S:g} s):"
            " Unix seconds when squeue started, e.g. date +%s.%N",
        )
    if read_at > arrival:
        log.warning(
            "reconcile: read_at is %.3f s after this service's clock: the pusher's clock runs"
            " ahead; the answer counts as taken %g s before it came, as without read_at",
            read_at - arrival,
            min(settings.squeue_timeout_s, OLDEST_S),
        )
        return slowest
    return datetime.fromtimestamp(read_at, UTC)
