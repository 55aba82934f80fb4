"""Running a flow: a generator that yields each step it waits on (a database
write, a reservation) and receives that step's result, or has its error thrown
in at the yield.

A flow is written once and driven two ways: ``drive`` blocks on each step
(worker threads: gRPC, the integrations), ``drive_async`` awaits it (the event
loop: REST /place and the Slurm filter, where a worker thread per request cost
more than the decision).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any, TypeVar

Result = TypeVar("Result")
Flow = Generator[Any, Any, Result]


def _advance(flow: Flow[Result], result: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand the last step's result (or error) to the flow: (True, its answer) when it
    finished, else (False, the next step)."""
    try:
        return False, flow.throw(error) if error is not None else flow.send(result)
    except StopIteration as done:
        return True, done.value


def drive(flow: Flow[Result], step: Callable[[Any], Any]) -> Result:
    result: Any = None
    error: BaseException | None = None
    while True:
        finished, request = _advance(flow, result, error)
        if finished:
            return request  # type: ignore[no-any-return]
        try:
            result, error = step(request), None
        except Exception as exc:
            result, error = None, exc


async def drive_async(flow: Flow[Result], step: Callable[[Any], Awaitable[Any]]) -> Result:
    result: Any = None
    error: BaseException | None = None
    while True:
        finished, request = _advance(flow, result, error)
        if finished:
            return request  # type: ignore[no-any-return]
        try:
            result, error = await step(request), None
        except Exception as exc:
            result, error = None, exc
