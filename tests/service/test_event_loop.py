"""The one way off the event loop, and the watch that catches blocking work left on it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Generator
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.event_loop import off_loop, run_here
from service.flows import drive, drive_async
from tests.service.loop_watch import LoopWatch, on_event_loop


def test_off_loop_runs_on_a_worker_thread_and_hands_back_its_answer_or_its_error() -> None:
    async def main() -> tuple[bool, bool, str]:
        here = on_event_loop()
        there, name = await off_loop(lambda: (on_event_loop(), threading.current_thread().name))
        return here, there, name

    here, there, name = asyncio.run(main())
    assert here and not there and name != threading.current_thread().name

    def refuse(message: str, *, code: int) -> None:
        raise ValueError(f"{message} {code}")

    with pytest.raises(ValueError, match="no 7"):
        asyncio.run(off_loop(refuse, "no", code=7))


def test_a_flows_blocking_steps_go_off_the_loop_driven_async_and_run_in_place_driven_blocking():
    def flow() -> Generator[Callable[[], object], object, tuple[object, object]]:
        first = yield on_event_loop
        second = yield lambda: threading.current_thread().name
        return first, second

    async def main() -> tuple[object, object]:
        return await drive_async(flow(), off_loop)

    on_loop, thread = asyncio.run(main())
    assert not on_loop and thread != threading.current_thread().name
    assert drive(flow(), run_here) == (False, threading.current_thread().name)


def test_the_watch_notes_a_database_connection_taken_on_the_loop_and_not_one_taken_off_it(
    tmp_path: Path,
) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'watch.sqlite3'}")

    def read() -> None:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    async def both() -> None:
        await off_loop(read)
        read()

    watch = LoopWatch()
    with watch.database(engine):
        read()  # no loop on this thread
        asyncio.run(both())
    assert len(watch.blocked) == 1 and "a database connection" in watch.blocked[0]
    assert "in both" in watch.blocked[0]  # where it came from
    with pytest.raises(AssertionError, match="on the event loop"):
        watch.check()
    engine.dispose()


def test_the_watch_notes_named_calls_made_on_the_loop() -> None:
    class Api:
        def list_pods(self, namespace: str) -> list[str]:
            return [namespace]

    api, watch = Api(), LoopWatch()
    watch.calls(api, "list_pods")

    async def main() -> list[str]:
        return api.list_pods("a") + await off_loop(api.list_pods, "b")

    assert asyncio.run(main()) == ["a", "b"]
    assert [b.splitlines()[0] for b in watch.blocked] == ["Api.list_pods on the event loop, from:"]
