"""Where old Idempotency-Keys went is forgotten past retention, in batches; a key within
retention, or held by a request, keeps its region."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service import migrate
from service.app import create_app
from service.db import make_engine
from service.federation import forward_retention, store
from service.schema import federation_forwards
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock, secured

DAY_S = 86_400.0


@pytest.fixture
def state(settings: Settings, clock: FakeClock) -> Iterator[ServiceState]:
    migrate.upgrade(settings.database_url)
    tuned = settings.model_copy(update={"federation_forward_retention_s": 7 * DAY_S})
    state = ServiceState(tuned, make_engine(settings.database_url), clock)
    try:
        yield state
    finally:
        state.engine.dispose()


def _forward(
    engine: sa.Engine, clock: FakeClock, key: str, age_s: float, held_for_s: float | None = None
) -> None:
    """A key forwarded ``age_s`` ago; held by a request until ``held_for_s`` from now."""
    now = clock()
    with engine.begin() as conn:
        conn.execute(
            federation_forwards.insert().values(
                idempotency_key=key,
                region="aws-east",
                gpu_model="H100",
                created_at=now - timedelta(seconds=age_s),
                holder=None if held_for_s is None else "a-request",
                held_until=None if held_for_s is None else now + timedelta(seconds=held_for_s),
            )
        )


def _keys(engine: sa.Engine) -> list[str]:
    query = sa.select(federation_forwards.c.idempotency_key).order_by(
        federation_forwards.c.idempotency_key
    )
    with engine.connect() as conn:
        return list(conn.execute(query).scalars())


def test_forwards_past_retention_go_and_those_within_it_keep_their_region(
    state: ServiceState, clock: FakeClock
) -> None:
    engine = state.engine
    _forward(engine, clock, "month-old", 30 * DAY_S)
    _forward(engine, clock, "eight-days-old", 8 * DAY_S)
    _forward(engine, clock, "holder-died", 8 * DAY_S, held_for_s=-1)  # its time is up
    _forward(engine, clock, "held-now", 8 * DAY_S, held_for_s=20)  # a retry routing it
    _forward(engine, clock, "almost-a-week", 7 * DAY_S - 1)
    _forward(engine, clock, "an-hour-old", 3600)
    assert forward_retention.prune(state) == 3
    assert _keys(engine) == ["almost-a-week", "an-hour-old", "held-now"]
    # A retry of a key within retention still goes where the key went.
    now = clock()
    found = store.take_key(engine, "almost-a-week", "retry", now, now + timedelta(seconds=20))
    assert found == ("aws-east", "H100")
    store.let_go_key(engine, "almost-a-week", "retry")
    clock.advance(2)  # a week old now
    assert forward_retention.prune(state) == 1
    assert _keys(engine) == ["an-hour-old", "held-now"]
    clock.advance(20)  # the request holding it is done, or died
    store.let_go_key(engine, "held-now", "a-request")
    assert forward_retention.prune(state) == 1
    assert _keys(engine) == ["an-hour-old"]
    # A key forgotten is a new key: routed afresh, its row made again.
    now = clock()
    assert store.take_key(engine, "month-old", "late", now, now + timedelta(seconds=20)) is None


def test_each_round_deletes_one_batch_at_most(
    state: ServiceState, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forward_retention, "PRUNE_BATCH", 3)
    for n in range(8):
        _forward(state.engine, clock, f"old-{n}", 10 * DAY_S + n)
    _forward(state.engine, clock, "new", 60)
    deleted: list[int] = []

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM FEDERATION_FORWARDS"):
            deleted.append(cursor.rowcount)

    sa.event.listen(state.engine, "after_cursor_execute", count)
    rounds = []
    while True:
        pruned = forward_retention.prune(state)
        rounds.append(pruned)
        if forward_retention.wait_after(pruned) > 0:
            break
    assert rounds == [3, 3, 2]
    assert deleted == [3, 3, 2]  # one statement a round, never over the batch
    assert _keys(state.engine) == ["new"]


def test_a_key_taken_while_it_is_pruned_keeps_its_region(
    state: ServiceState, clock: FakeClock
) -> None:
    """A retry takes the key's row as the prune deletes it: the prune must see the hold,
    or the retry's twin would find no row and route the key to another region."""
    engine = state.engine
    _forward(engine, clock, "k", 8 * DAY_S)
    t = federation_forwards
    now = clock()
    pruned: list[int] = []
    failed: list[BaseException] = []

    def prune() -> None:
        try:
            pruned.append(forward_retention.prune(state))
        except BaseException as exc:  # shown by the test, not lost with the thread
            failed.append(exc)

    with (
        _lock_watch(engine) as blocked,
        engine.begin() as conn,  # the retry's take_key, not committed yet
    ):
        conn.execute(
            t.update()
            .where(t.c.idempotency_key == "k")
            .values(holder="retry", held_until=now + timedelta(seconds=20))
        )
        pruning = threading.Thread(target=prune)
        pruning.start()
        waited = blocked(pruning)
    pruning.join(30)
    assert not failed, failed
    assert waited, "the prune never waited on the held row"
    assert pruned == [0]
    assert _keys(engine) == ["k"]


@contextlib.contextmanager
def _lock_watch(engine: sa.Engine) -> Iterator[Callable[[threading.Thread], bool]]:
    """A check, on a connection made beforehand (a loaded machine may take a while to
    connect), that waits until the thread waits on a row lock: True once Postgres says
    so, False if the thread ended first or 30 s passed; on SQLite, True after a moment.
    Each look is a transaction of its own: the first version read pg_stat_activity
    in one transaction, so a first look before the prune waited was all it ever saw
    (a flake on a loaded machine)."""
    if engine.dialect.name != "postgresql":
        yield lambda _thread: time.sleep(0.5) is None
        return
    query = sa.text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
    )
    watcher = make_engine(engine.url.render_as_string(hide_password=False))
    try:
        with watcher.connect() as watch:

            def blocked(thread: threading.Thread) -> bool:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and thread.is_alive():
                    waiting = watch.execute(query).scalar_one()
                    # Postgres keeps one snapshot of pg_stat_activity per transaction: a
                    # first read before the prune waited would be read again and again.
                    watch.rollback()
                    if waiting:
                        return True
                    time.sleep(0.02)
                return False

            yield blocked
    finally:
        watcher.dispose()


def test_retention_defaults_to_a_week_and_is_never_under_an_hour() -> None:
    assert Settings().federation_forward_retention_s == 7 * DAY_S
    with pytest.raises(ValidationError):
        Settings(federation_forward_retention_s=600)


def test_the_background_loop_prunes_the_forwards(settings: Settings, clock: FakeClock) -> None:
    migrate.upgrade(settings.database_url)
    engine = make_engine(settings.database_url)
    try:
        _forward(engine, clock, "old", 8 * DAY_S)
        _forward(engine, clock, "new", 60)
        app = create_app(secured(settings), clock=clock, background=True)
        with TestClient(app):
            deadline = time.monotonic() + 10
            while _keys(engine) != ["new"] and time.monotonic() < deadline:
                time.sleep(0.05)
        assert _keys(engine) == ["new"]
    finally:
        engine.dispose()
