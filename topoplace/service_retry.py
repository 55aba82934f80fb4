"""Calls to the service retried while it asks to be asked later, within one time limit.

For a command that must end on its own (the Slurm epilog: the job stays
completing while it runs) yet should not give up at the first 429, 503 or
unanswered request. A try-later failure is ``ApiError.try_later`` (429, 5xx)
or ``ServiceUnreachable``; any other answer, a refusal, is raised at once.
Retries wait a doubling backoff, or the answer's Retry-After where longer.
No try starts past the limit and no wait ends past it, so a command ends
within the limit plus one request's timeout. Once a call has run out of time
every later call fails at once: the time is spent, and the service is down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from topoplace_client.api import ApiError, ServiceUnreachable
from topoplace_client.retry_after import retry_after_s

T = TypeVar("T")

FIRST_WAIT_S = 0.25


class OutOfTime(Exception):
    """The service asked to be asked later and the time limit came first; says why."""


class Patience:
    """``call(fn)`` runs ``fn`` until it returns, is refused, or ``limit_s`` (from when
    this was made) runs out: ``OutOfTime`` with the last try-later reason."""

    def __init__(
        self,
        limit_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.limit_s = limit_s
        self.started = clock()
        self.deadline = self.started + limit_s
        self.spent: str | None = None  # why the time ran out, once it has
        self.retries = 0

    def call(self, fn: Callable[[], T]) -> T:
        backoff = FIRST_WAIT_S
        while True:
            if self.spent is None and self.clock() >= self.deadline:
                self.spent = f"the {self.limit_s:g} s limit was spent before this request"
            if self.spent is not None:
                raise OutOfTime(self.spent)
            try:
                return fn()
            except ApiError as exc:
                if not exc.try_later:
                    raise
                reason = exc.line()
                asked = retry_after_s(exc.retry_after, self.wall())
            except ServiceUnreachable as exc:
                reason, asked = str(exc), None
            wait = max(backoff, asked or 0.0)
            if self.clock() + wait >= self.deadline:
                # Waiting less than asked would add to an overloaded service's load, and
                # waiting past the limit would keep the caller past its own.
                took = self.clock() - self.started
                self.spent = f"{reason}; gave up after {self.retries} retries in {took:.1f} s"
                raise OutOfTime(self.spent)
            self.sleep(wait)
            self.retries += 1
            backoff *= 2
