"""The shared wait: it returns what the condition gave, and fails saying what never came."""

from __future__ import annotations

import itertools

import pytest

from tests.waiting import wait_until


def test_returns_the_first_true_answer() -> None:
    answers = itertools.chain([0, None, ""], itertools.repeat("done"))
    assert wait_until(lambda: next(answers), "an answer", interval_s=0) == "done"


def test_fails_naming_what_never_came() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"not within 0\.05 s: the door opening"):
        wait_until(lambda: False, "the door opening", timeout_s=0.05, interval_s=0.01)


def test_a_check_that_came_true_during_the_last_interval_passes() -> None:
    # One long interval past the deadline: the check at the deadline still counts.
    answers = iter([False, True])
    assert wait_until(lambda: next(answers), "the second answer", timeout_s=0.01, interval_s=0.05)
