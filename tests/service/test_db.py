"""The database engine: SQLite's checkpoints happen off the commit path."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.app import create_app
from service.db import WAL_BACKSTOP_PAGES, checkpoint, make_engine, postgres_connect_args
from service.settings import Settings


def _write_rows(engine: sa.Engine, count: int) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, v TEXT)")
    for i in range(count):
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO t (v) VALUES (?)", (f"row {i} " + "x" * 3000,))


def test_sqlite_commits_leave_checkpoints_to_the_service(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'db.sqlite3'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == WAL_BACKSTOP_PAGES
    # Past SQLite's default threshold of 1,000 pages, no commit has checkpointed.
    _write_rows(engine, 1_500)
    wal = tmp_path / "db.sqlite3-wal"
    assert wal.stat().st_size > 1_000 * 4096

    result = checkpoint(engine)

    assert result is not None
    logged, copied = result
    assert logged > 1_000
    assert copied == logged  # nothing else was reading: every frame reached the database
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 1_500
    engine.dispose()


def test_postgres_connections_have_limits_unless_the_url_sets_its_own(postgres_url: str) -> None:
    assert postgres_connect_args("postgresql+psycopg://u@db/x")["connect_timeout"] == 10
    mine = postgres_connect_args("postgresql+psycopg://u@db/x?connect_timeout=3&keepalives_idle=5")
    assert "connect_timeout" not in mine and "keepalives_idle" not in mine
    assert mine["keepalives_count"] == 3
    engine = make_engine(postgres_url)  # the limits reach libpq: a real connection has them
    try:
        with engine.connect() as conn:
            params = conn.connection.dbapi_connection.info.get_parameters()  # type: ignore[union-attr]
            assert params["connect_timeout"] == "10" and params["keepalives_idle"] == "30"
    finally:
        engine.dispose()


def test_checkpoint_is_a_no_op_on_other_databases(postgres_url: str) -> None:
    engine = make_engine(postgres_url)
    try:
        assert checkpoint(engine) is None
    finally:
        engine.dispose()


def test_the_running_service_checkpoints_sqlite_in_the_background(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'service.sqlite3'}"
    app = create_app(Settings(database_url=url), background=True)
    with TestClient(app):
        engine = app.state.service.engine
        _write_rows(engine, 1_500)  # about 6,000 pages, all in the log
        # The database file grows only when a checkpoint copies the log into it;
        # the backstop threshold is far off, so only the background loop can.
        database = tmp_path / "service.sqlite3"
        deadline = time.monotonic() + 10
        while database.stat().st_size < 1_500 * 3_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert database.stat().st_size >= 1_500 * 3_000


def test_engines_opening_a_new_file_at_once_all_connect_in_wal_mode(tmp_path: Path) -> None:
    """Switching to WAL takes a lock SQLite does not wait for: without the retry one of
    two engines opening a fresh file at once failed with 'database is locked'."""
    for round_ in range(20):
        url = f"sqlite:///{tmp_path / f'fresh-{round_}.sqlite3'}"
        plain = sa.create_engine(url)  # made as migrations make it: not in WAL mode
        with plain.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        plain.dispose()
        engines = [make_engine(url) for _ in range(4)]
        start = threading.Barrier(len(engines))

        def open_one(engine: sa.Engine, start: threading.Barrier = start) -> str:
            start.wait()
            with engine.connect() as conn:
                return str(conn.exec_driver_sql("PRAGMA journal_mode").scalar())

        with ThreadPoolExecutor(len(engines)) as pool:
            modes = list(pool.map(open_one, engines))
        for engine in engines:
            engine.dispose()
        assert modes == ["wal"] * len(engines)


def test_postgres_sessions_end_when_idle_in_a_transaction(postgres_url: str) -> None:
    """The timeout is each session's, beside options the URL gives; 0 leaves the server's."""
    given = sa.make_url(postgres_url).update_query_dict({"options": "-c statement_timeout=5000"})
    engine = make_engine(given.render_as_string(hide_password=False), 2.5)
    off = make_engine(postgres_url, 0)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == (
                "2500ms"
            )
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "5s"
        with off.connect() as conn:
            assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "0"
    finally:
        engine.dispose()
        off.dispose()


def test_the_idle_in_transaction_timeout_fits_postgres() -> None:
    """Postgres takes at most 2,147,483,647 ms; a larger value would stop every connection."""
    assert Settings().database_idle_in_transaction_s == 30
    assert Settings(database_idle_in_transaction_s=2_147_483).database_idle_in_transaction_s
    with pytest.raises(ValueError, match="less than or equal"):
        Settings(database_idle_in_transaction_s=2_147_484)


def test_times_are_answered_in_utc_whatever_the_servers_time_zone(postgres_url: str) -> None:
    """A server (or database, or role) whose TimeZone is not UTC handed every timestamp
    back in its own offset: the API wrote "2026-06-01T17:30:00+05:30" where it documents
    UTC with "Z" (service/allocations/encoding.py). Each session is in UTC now."""
    from tests.service.conftest import _truncate
    from tests.service.helpers import add_nodes

    _truncate(postgres_url)
    elsewhere = sa.make_url(postgres_url).update_query_dict({"options": "-c TimeZone=Asia/Kolkata"})
    settings = Settings(database_url=elsewhere.render_as_string(hide_password=False))
    with TestClient(create_app(settings, background=False)) as client:
        add_nodes(client, ("hgx-h100", "h0"))
        placed = client.post("/v1/place", json={"gpus": 1, "ttl_s": 30})
        assert placed.status_code == 201, placed.text
        read = client.get(f"/v1/allocations/{placed.json()['id']}").json()
        for answer in (placed.json(), read):
            assert answer["created_at"].endswith("Z"), answer["created_at"]
            assert answer["expires_at"].endswith("Z"), answer["expires_at"]
    _truncate(postgres_url)
