"""Calls to the service retried while it asks to be asked later, within one time limit.

For a program that must end on its own yet should not give up at the first 429,
503 or unanswered request: the Slurm epilog (the job stays completing while it
runs) and the Slurm prolog (the job's launch waits for it). What counts as a
try-later failure is the caller's to say (``TryLater``): for the client library
(the epilog, ``client_try_later``) ``ApiError.try_later`` (429, 5xx) or
``ServiceUnreachable``; for the prolog's urllib, the same answers as urllib
raises them (topoplace/slurm_prolog.py). Any other failure, a refusal, is
raised at once. Retries wait a doubling backoff, or the answer's Retry-After
where longer. No try starts past the limit and no wait ends past it, so a
program ends within the limit plus one request's timeout. Once a call has run
out of time every later call fails at once: the time is spent, and the service
is down.

Standard library only, so that the prolog, which the job's launch waits for,
may use it without importing httpx (``client_try_later`` imports the client
library when it is first asked, by which time the epilog has loaded it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TypeVar

from topoplace_client.arguments import seconds_up_to
from topoplace_client.retry_after import retry_after_s

T = TypeVar("T")

FIRST_WAIT_S = 0.25

# A failure's (reason in one line, its Retry-After header or None) where the same
# request may succeed later; None where it is a refusal, raised at once.
TryLater = Callable[[Exception], tuple[str, str | None] | None]


def add_retry_for(
    parser: argparse.ArgumentParser, default_s: float, max_s: float, *, waits: str, then: str
) -> None:
    """The program's ``--retry-for SECONDS``, its ``Patience``'s limit: more than 0 and at
    most ``max_s`` (the program must end on its own). ``waits``: what the wait holds up;
    ``then``: what the program does once the time is spent."""
    parser.add_argument(
        "--retry-for",
        type=seconds_up_to(max_s),
        default=default_s,
        metavar="SECONDS",
        help="ask again a service that answers 429 or 5xx, or none, for this long in all"
        f" (default {default_s:g}, at most {max_s:g}; {waits}), then {then}",
    )


class OutOfTime(Exception):
    """The service asked to be asked later and the time limit came first; says why."""


def client_try_later(exc: Exception) -> tuple[str, str | None] | None:
    """The client library's try-later failures: an ``ApiError`` whose ``try_later`` is
    set (429, 5xx), with its Retry-After, and ``ServiceUnreachable`` (no answer)."""
    from topoplace_client.api import ApiError, ServiceUnreachable

    if isinstance(exc, ApiError):
        return (exc.line(), exc.retry_after) if exc.try_later else None
    if isinstance(exc, ServiceUnreachable):
        return str(exc), None
    return None


class Patience:
    """``call(fn)`` runs ``fn`` until it returns, is refused, or ``limit_s`` (from when
    this was made) runs out: ``OutOfTime`` with the last try-later reason. A failure
    is try-later where ``try_later`` gives its reason (the client library's, unless
    named)."""

    def __init__(
        self,
        limit_s: float,
        *,
        try_later: TryLater = client_try_later,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.try_later = try_later
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.limit_s = limit_s
        self.started = clock()
        self.deadline = self.started + limit_s
        self.spent: str | None = None  # why the time ran out, once it has
        self.retries = 0

    def call(self, fn: Callable[[], T]) -> T:
        backoff = FIRST_WAIT_S
        reason: str | None = None  # the last try-later answer's, once there is one
        while True:
            if self.spent is None and self.clock() >= self.deadline:
                # A wait due before the limit can end past it on a busy machine: the
                # answer that was being waited out is still the reason.
                self.spent = (
                    self._gave_up(reason)
                    if reason is not None
                    else f"the {self.limit_s:g} s limit was spent before this request"
                )
            if self.spent is not None:
                raise OutOfTime(self.spent)
            try:
                return fn()
            except Exception as exc:
                said = self.try_later(exc)
                if said is None:
                    raise
                reason, header = said
            asked = retry_after_s(header, self.wall())
            wait = max(backoff, asked or 0.0)
            if self.clock() + wait >= self.deadline:
                # Waiting less than asked would add to an overloaded service's load, and
                # waiting past the limit would keep the caller past its own.
                self.spent = self._gave_up(reason)
                raise OutOfTime(self.spent)
            self.sleep(wait)
            self.retries += 1
            backoff *= 2

    def _gave_up(self, reason: str) -> str:
        took = self.clock() - self.started
        return f"{reason}; gave up after {self.retries} retries in {took:.1f} s"
