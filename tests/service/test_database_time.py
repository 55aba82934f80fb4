"""Replicas whose host clocks disagree, on one database: decisions are on its clock.

A reservation's TTL, its expiry, a confirm's or an extend's guard and a node's
heartbeat are stamped by one replica and judged by another. Judged on each
host's own clock, a replica whose clock ran 60 s ahead expired another's
30-second reservation as soon as it was made and gave its GPUs to a second job
while the first, told it held them, went on to start on them; one 60 s behind
kept placing on a node silent for longer than the heartbeat TTL. Each replica
here has a host clock of its own and shares the database's (``database``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service import app as app_module
from service.allocations import api
from service.app import create_app
from service.database_time import MAX_ROUND_TRIP_S, Clock, DatabaseTime, database_reader
from service.db import make_engine
from service.settings import Settings
from service.state import ServiceState, utc_now
from tests.service.conftest import FakeClock, _truncate
from tests.service.deaf_replicas import deaf_listener  # noqa: F401
from tests.service.helpers import add_nodes

pytestmark = pytest.mark.usefixtures("deaf_listener")


def _clock(offset_s: float) -> FakeClock:
    clock = FakeClock()
    clock.advance(offset_s)
    return clock


@contextlib.contextmanager
def _replica(settings: Settings, host: FakeClock, database: FakeClock) -> Iterator[TestClient]:
    app = create_app(settings, clock=host, database_clock=database, background=False)
    with TestClient(app) as client:
        yield client


def _state(client: TestClient) -> ServiceState:
    return client.app.state.service  # type: ignore[attr-defined,no-any-return]


def _devices(allocation: dict[str, Any]) -> set[tuple[str, str]]:
    return {(t["node"], g) for t in allocation["tasks"] for g in t["gpu_uuids"]}


@pytest.mark.parametrize("skew_s", [60, -60], ids=["sweeper_ahead", "placer_behind"])
def test_a_reservation_is_not_expired_by_a_replica_whose_clock_disagrees(
    settings: Settings, skew_s: float
) -> None:
    database = FakeClock()
    # The sweeper's host clock is skew_s ahead of the placer's; the database's is the
    # placer's (ahead) or the sweeper's (behind).
    placer_host = database if skew_s > 0 else _clock(-abs(skew_s))
    sweeper_host = _clock(skew_s) if skew_s > 0 else database
    with (
        _replica(settings, placer_host, database) as placer,
        _replica(settings, sweeper_host, database) as sweeper,
    ):
        add_nodes(placer, ("hgx-h100", "h0"))
        _state(sweeper).sync_nodes(None)
        first = placer.post("/v1/place", json={"gpus": 8, "ttl_s": 30, "job_id": "first"})
        assert first.status_code == 201, first.text

        api.sweep(_state(sweeper))
        second = sweeper.post("/v1/place", json={"gpus": 8, "ttl_s": 30, "job_id": "second"})

        # Within its TTL by every clock but a wrong one: the first job's GPUs are its own.
        assert second.status_code != 201 or not _devices(second.json()) & _devices(first.json())
        confirmed = placer.post(f"/v1/allocations/{first.json()['id']}/confirm")
        assert confirmed.status_code == 200, confirmed.text

        # Its TTL still ends it, on the database's clock, whoever sweeps.
        released = placer.post(f"/v1/allocations/{first.json()['id']}/release")
        assert released.status_code in (200, 204), released.text
        again = placer.post("/v1/place", json={"gpus": 8, "ttl_s": 30, "job_id": "third"})
        assert again.status_code == 201, again.text
        for clock in {id(c): c for c in (database, placer_host, sweeper_host)}.values():
            clock.advance(31)
        placer.post("/v1/nodes/h0/heartbeat")
        assert api.sweep(_state(sweeper)).ids == (again.json()["id"],)


def test_a_replica_whose_clock_is_behind_places_nothing_on_a_silent_node(
    settings: Settings,
) -> None:
    database = FakeClock()
    behind_host = _clock(-60)
    with _replica(settings, database, database) as fresh:
        add_nodes(fresh, ("hgx-h100", "h0"))
        with _replica(settings, behind_host, database) as behind:
            # The node's agent falls silent for longer than the heartbeat TTL (60 s).
            database.advance(100)
            behind_host.advance(100)

            refused = behind.post("/v1/place", json={"gpus": 1, "job_id": "on-a-dead-node"})

            assert refused.status_code != 201, refused.text
            assert behind.get("/v1/nodes/h0").json()["state"] == "stale"


def test_a_replica_whose_clock_is_ahead_still_places_on_a_live_node(settings: Settings) -> None:
    database = FakeClock()
    ahead_host = _clock(61)
    with _replica(settings, database, database) as fresh:
        add_nodes(fresh, ("hgx-h100", "h0"))
        with _replica(settings, ahead_host, database) as ahead:
            placed = ahead.post("/v1/place", json={"gpus": 1, "job_id": "on-a-live-node"})

            assert placed.status_code == 201, placed.text


def test_the_database_time_counts_on_from_its_reading_and_reads_again() -> None:
    database, host = FakeClock(), _clock(90)
    ticks = [100.0]
    clock = DatabaseTime(database, host, lambda: ticks[0])

    assert clock() == database.now  # the first call reads the database
    assert clock.offset_s == 90
    ticks[0] += 5  # the host's wall clock is stepped back: the database time moves on
    host.advance(-3600)
    assert clock() == database.now + timedelta(seconds=5)
    database.advance(7)
    clock.measure()
    assert clock() == database.now
    assert clock.offset_s == pytest.approx(-3600 + 90 - 7)


def test_a_slow_reading_keeps_the_one_before() -> None:
    database, ticks = FakeClock(), [0.0]

    def slow() -> datetime:
        ticks[0] += 2 * MAX_ROUND_TRIP_S
        return database.now + timedelta(seconds=60)  # read late, and wrong by then

    readings: Iterator[Clock] = iter([database, slow])
    clock = DatabaseTime(lambda: next(readings)(), database, lambda: ticks[0])
    clock.measure()
    clock.measure()

    assert clock() == database.now + timedelta(seconds=2 * MAX_ROUND_TRIP_S)


def test_postgres_is_read_for_its_own_clock(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        read = database_reader(engine)
        assert read is not None
        assert abs((read() - utc_now()).total_seconds()) < 5  # one host's clock, here
        clock = DatabaseTime(read, lambda: utc_now() + timedelta(seconds=120))
        clock.measure()
        assert clock.offset_s is not None and 115 < clock.offset_s < 125
        assert abs((clock() - utc_now()).total_seconds()) < 5
    finally:
        engine.dispose()


def test_sqlite_has_no_clock_but_the_hosts(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    try:
        assert database_reader(engine) is None
    finally:
        engine.dispose()


def test_a_replica_on_postgres_decides_on_the_servers_clock(postgres_url: str) -> None:
    """Production's wiring (no clock given): the host's clock shows only in the metric."""
    settings = Settings(database_url=postgres_url, reservation_ttl_s=30)
    _truncate(postgres_url)
    app = create_app(settings, background=False)
    with TestClient(app) as client:
        state = _state(client)
        assert isinstance(state.clock, DatabaseTime)
        assert abs((state.clock() - utc_now()).total_seconds()) < 5
        offset = next(
            line
            for line in client.get("/metrics").text.splitlines()
            if line.startswith("topoplace_clock_offset_seconds ")
        )
        assert abs(float(offset.split()[1])) < 5


def test_the_background_loop_reads_the_database_clock_again(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app_module, "MEASURE_INTERVAL_S", 0.05)
    database, reads = FakeClock(), []

    def read() -> datetime:
        reads.append(database.now)
        return database.now

    app = create_app(settings, clock=FakeClock(), database_clock=read)
    with TestClient(app):
        deadline = time.monotonic() + 10
        while len(reads) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)

    assert len(reads) >= 3  # at start, then every interval
