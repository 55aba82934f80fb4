"""A snapshot report that meets a deadlock is run again, not answered 503 (Postgres).

A report moves its node row's seq and reported_at, which the node's holds name
(``ON UPDATE CASCADE``): it takes the node row, then each hold. A release or a
reservation of another replica takes holds, then the node row (its foreign key
checks); the two can wait on each other, and Postgres ends one of them. Racing
reports against places and releases on two replicas met it about once in a
hundred reports, each answered 503 ``database_unavailable`` with the database up.
"""

from __future__ import annotations

import threading
import time

import psycopg
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service.app import create_app
from service.notify import psycopg_dsn
from service.settings import Settings
from tests.service.conftest import FakeClock, _truncate
from tests.service.helpers import report

WAIT_S = 20.0


def _waiting_on_a_lock(dsn: str, other_than: int) -> bool:
    """Whether a backend other than ``other_than`` waits on a row lock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND pid <> %s AND datname = current_database()",
            (other_than,),
        ).fetchone()
    return bool(found and found[0])


def _lock_holds_then_node(dsn: str, locked: threading.Event, done: threading.Event) -> None:
    """Take the node's holds, wait for another transaction to wait on them, then take
    the node row: a release's or a reservation's order against a report's."""
    with psycopg.connect(dsn) as conn:
        # The report, whose wait starts first, is the one Postgres ends.
        conn.execute("SET deadlock_timeout = '30s'")
        conn.execute("SELECT 1 FROM gpu_holds WHERE node = 'h0' FOR UPDATE")
        locked.set()
        pid = conn.info.backend_pid
        deadline = time.monotonic() + WAIT_S
        while not _waiting_on_a_lock(dsn, pid):
            assert time.monotonic() < deadline, "the report never waited on the holds"
            time.sleep(0.02)
        conn.execute("SELECT 1 FROM nodes WHERE name = 'h0' FOR KEY SHARE")
        conn.rollback()
    done.set()


def test_a_report_that_meets_a_deadlock_is_run_again(postgres_url: str) -> None:
    _truncate(postgres_url)
    settings = Settings(database_url=postgres_url, heartbeat_ttl_s=60, reservation_ttl_s=120)
    snap = build_profile("hgx-h100", "h0")
    app = create_app(settings, clock=FakeClock(), background=False)
    with TestClient(app) as client:
        assert report(client, snap).status_code == 200
        assert client.post("/v1/place", json={"gpus": 1}).status_code == 201
        dsn = psycopg_dsn(postgres_url)
        locked, done = threading.Event(), threading.Event()
        errors: list[BaseException] = []

        def blocker() -> None:
            try:
                _lock_holds_then_node(dsn, locked, done)
            except BaseException as exc:  # raised in the test below
                errors.append(exc)
                locked.set()

        thread = threading.Thread(target=blocker)
        thread.start()
        assert locked.wait(WAIT_S)
        again = report(client, snap.model_copy(update={"seq": snap.seq + 1}))
        thread.join(WAIT_S)
        assert not errors, errors
        assert done.is_set()
        assert again.status_code == 200, again.text
        engine = sa.create_engine(postgres_url)
        try:
            with engine.connect() as conn:
                stored = conn.execute(sa.text("SELECT seq FROM nodes WHERE name = 'h0'"))
                assert stored.scalar_one() == snap.seq + 1
        finally:
            engine.dispose()
