"""Catching blocking work on the event loop (the rule of service/event_loop.py).

A thread that is running an event loop has one: ``asyncio.get_running_loop()``
answers there and raises RuntimeError on any other thread (a worker thread,
the group committer, the test's own thread). A watch records each database
connection taken, and each named call made, on such a thread, with where it
came from.
"""

from __future__ import annotations

import asyncio
import functools
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine


def on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class LoopWatch:
    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()  # everything noted, wherever it ran
        self.blocked: list[str] = []  # what ran on the loop, each with its stack

    def note(self, what: str) -> None:
        self.seen[what] += 1
        if on_event_loop():
            stack = "".join(traceback.format_stack(limit=14)[:-1])
            self.blocked.append(f"{what} on the event loop, from:\n{stack}")

    @contextmanager
    def database(self, engine: Engine) -> Iterator[None]:
        """Every connection taken from the engine's pool (SQLAlchemy's and the group
        committer's raw ones alike) is noted."""

        def checkout(*_: Any) -> None:
            self.note("a database connection")

        sa.event.listen(engine, "checkout", checkout)
        try:
            yield
        finally:
            sa.event.remove(engine, "checkout", checkout)

    def calls(self, target: object, *names: str) -> None:
        """Note each call of these methods of ``target`` (an instance: its attributes are
        replaced by wrappers for its lifetime)."""
        for name in names:
            method: Callable[..., Any] = getattr(target, name)

            @functools.wraps(method)
            def wrapper(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
                self.note(f"{type(target).__name__}.{_name}")
                return _method(*args, **kwargs)

            setattr(target, name, wrapper)

    def check(self, allowed: str | None = None) -> None:
        """Nothing ran on the loop, but what function ``allowed`` did (named in its stack)."""
        blocked = [b for b in self.blocked if allowed is None or f", in {allowed}\n" not in b]
        assert not blocked, "\n".join(blocked)
