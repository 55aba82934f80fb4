"""Waiting in tests for something to happen, never for a fixed time.

A fixed sleep is either too short on a loaded machine (the test fails) or
longer than needed everywhere else (the suite is slow). Tests wait instead
for the condition itself, with a deadline generous enough for a loaded CI
machine; the deadline is only reached when the condition never comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0


def wait_until(
    check: Callable[[], T],
    what: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    interval_s: float = 0.05,
) -> T:
    """Call ``check`` until it returns something true and return that; fail the test
    saying ``what`` was awaited if ``timeout_s`` passes first. The check runs once more
    at the deadline, so a slow last interval does not fail a condition that came true."""
    deadline = time.monotonic() + timeout_s
    while True:
        expired = time.monotonic() >= deadline
        result = check()
        if result:
            return result
        if expired:
            pytest.fail(f"not within {timeout_s:g} s: {what}")
        time.sleep(interval_s)
