"""Retention: rows older than TOPOPLACE_AUDIT_RETENTION_DAYS go, a batch a round; 0 keeps all."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import migrate
from service.app import create_app
from service.audit import records, retention, store
from service.db import make_engine
from service.federation import forward_retention
from service.schema import audit_log
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock, secured


def _state(settings: Settings, clock: FakeClock, days: float) -> ServiceState:
    migrate.upgrade(settings.database_url)
    tuned = settings.model_copy(update={"audit_retention_days": days})
    return ServiceState(tuned, make_engine(settings.database_url), clock)


def _write(state: ServiceState, ages_days: list[float], now_clock: FakeClock) -> None:
    now = now_clock()
    rows = [records.record("admin", f"aged_{age}", now - timedelta(days=age)) for age in ages_days]
    with state.engine.begin() as conn:
        store.write(conn, rows)


def _actions(state: ServiceState) -> list[str]:
    with state.engine.connect() as conn:
        query = sa.select(audit_log.c.action).order_by(audit_log.c.id)
        return list(conn.execute(query).scalars())


def test_rows_past_retention_are_pruned_a_batch_a_round(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backlog goes one batch per call, the next round at once while batches come out
    full: a call that deleted the whole backlog held the background loop (its expiry
    sweep and Slurm reconcile) until the last row was gone."""
    state = _state(settings, clock, days=30)
    try:
        _write(state, [45, 40, 31, 29, 1], clock)
        _write(state, [100] * 7, clock)
        monkeypatch.setattr(retention, "PRUNE_BATCH", 3)  # 10 rows past retention
        rounds: list[tuple[int, float]] = []
        while not rounds or rounds[-1][1] == 0.0:
            pruned = retention.prune(state)
            rounds.append((pruned, retention.wait_after(state, pruned)))
        interval = state.settings.audit_prune_interval_s
        assert rounds == [(3, 0.0), (3, 0.0), (3, 0.0), (1, interval)]
        assert _actions(state) == ["aged_29", "aged_1"]
        assert retention.prune(state) == 0
        clock.advance(2 * 86_400)  # two days on, the 29-day-old row is past 30
        assert retention.prune(state) == 1
        assert _actions(state) == ["aged_1"]
    finally:
        state.engine.dispose()


def test_zero_days_keeps_everything(settings: Settings, clock: FakeClock) -> None:
    state = _state(settings, clock, days=0)
    try:
        _write(state, [10_000, 1], clock)
        assert retention.prune(state) == 0
        assert len(_actions(state)) == 2
    finally:
        state.engine.dispose()


def test_a_failing_prune_waits_an_interval_and_holds_up_no_other_work(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prune that fails (a database role without DELETE on an append-only audit log,
    a statement timeout on a backlog) is tried again TOPOPLACE_AUDIT_PRUNE_INTERVAL_S
    on. Tried again every round of the loop (0.1 s), it logged ten tracebacks a second,
    and the loop's work after it, the forwarded keys' pruning, never ran."""
    migrate.upgrade(settings.database_url)
    audit_calls: list[float] = []
    forward_calls: list[float] = []

    def refused(state: ServiceState) -> int:
        audit_calls.append(time.monotonic())
        raise sa.exc.ProgrammingError("DELETE", {}, Exception("permission denied"))

    def forwarded(state: ServiceState) -> int:
        forward_calls.append(time.monotonic())
        return 0

    monkeypatch.setattr(retention, "prune", refused)
    monkeypatch.setattr(forward_retention, "prune", forwarded)
    app = create_app(secured(settings), clock=clock, background=True)
    with TestClient(app):
        deadline = time.monotonic() + 10
        while not forward_calls and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)  # ten rounds of the loop
    assert forward_calls
    assert len(audit_calls) == 1
