"""Patience: retrying a service that asks to be asked later, within one time limit."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from topoplace.service_retry import OutOfTime, Patience
from topoplace_client.api import ApiError, ServiceUnreachable


class Clock:
    """A clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def patience(clock: Clock, limit_s: float = 5.0) -> Patience:
    return Patience(limit_s, clock=clock, wall=lambda: 1_000_000.0, sleep=clock.sleep)


def raising(errors: list[Exception]) -> tuple[list[int], Callable[[], str]]:
    """A call that raises ``errors`` in turn, then answers; and how many times it ran."""
    calls = [0]

    def call() -> str:
        calls[0] += 1
        if errors:
            raise errors.pop(0)
        return "done"

    return calls, call


def test_try_later_answers_are_retried_with_a_doubling_backoff_or_their_retry_after() -> None:
    clock = Clock()
    busy = ApiError("rate_limited", "slow down", 429, retry_after="2")
    calls, call = raising([ServiceUnreachable("x", "refused"), busy, ApiError("e", "m", 503)])
    assert patience(clock).call(call) == "done"
    assert calls == [4] and clock.slept == [0.25, 2.0, 1.0]


def test_a_refusal_is_raised_at_once() -> None:
    clock = Clock()
    calls, call = raising([ApiError("conflict", "no", 409)])
    with pytest.raises(ApiError):
        patience(clock).call(call)
    assert calls == [1] and clock.slept == []


def test_a_retry_after_past_the_limit_gives_up_at_once_and_so_does_every_later_call() -> None:
    clock = Clock()
    waiting = patience(clock, limit_s=5.0)
    calls, call = raising([ApiError("rate_limited", "slow down", 429, retry_after="60")])
    with pytest.raises(OutOfTime, match="Retry-After: 60"):
        waiting.call(call)
    with pytest.raises(OutOfTime):
        waiting.call(call)
    assert calls == [1] and clock.slept == []


def test_no_call_starts_past_the_limit() -> None:
    clock = Clock()
    waiting = patience(clock, limit_s=1.0)
    clock.now = 1.0
    calls, call = raising([])
    with pytest.raises(OutOfTime, match="limit was spent"):
        waiting.call(call)
    assert calls == [0]


def test_a_wait_that_overruns_the_limit_still_names_the_last_answer() -> None:
    """A busy machine's sleep can end past the limit though the wait was due before it:
    the next try does not start, and what is said is still why it was waiting. It used
    to be only 'the 1.5 s limit was spent before this request', the service's 429
    (rate_limited) lost from the epilog's line."""
    clock = Clock()
    waiting = patience(clock, limit_s=1.5)
    overslept = clock.sleep

    def late(seconds: float) -> None:
        overslept(seconds + 1.0)

    waiting.sleep = late
    calls, call = raising([ApiError("rate_limited", "slow down", 429, retry_after="1")])
    with pytest.raises(OutOfTime, match=r"rate_limited.*gave up after 1 retries in 2\.0 s"):
        waiting.call(call)
    assert calls == [1]
