"""A flow gets each step's result back, or its error thrown in where it waited."""

from __future__ import annotations

import asyncio
from collections.abc import Generator

import pytest

from service.flows import drive, drive_async


def _flow() -> Generator[int, int, str]:
    doubled = yield 1
    try:
        yield -1  # a step that fails
    except ValueError as exc:
        caught = str(exc)
    else:
        caught = "nothing"
    return f"{doubled} {caught}"


def _step(value: int) -> int:
    if value < 0:
        raise ValueError("negative")
    return value * 2


async def _async_step(value: int) -> int:
    return _step(value)


def test_both_drivers_send_results_and_throw_errors_into_the_flow() -> None:
    assert drive(_flow(), _step) == "2 negative"
    assert asyncio.run(drive_async(_flow(), _async_step)) == "2 negative"


def test_an_error_the_flow_does_not_catch_reaches_the_caller() -> None:
    def failing() -> Generator[int, int, str]:
        yield -1
        return "unreachable"

    with pytest.raises(ValueError, match="negative"):
        drive(failing(), _step)
    with pytest.raises(ValueError, match="negative"):
        asyncio.run(drive_async(failing(), _async_step))
