"""The database engine: SQLite's checkpoints happen off the commit path."""

from __future__ import annotations

import time
from pathlib import Path

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.app import create_app
from service.db import WAL_BACKSTOP_PAGES, checkpoint, make_engine
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
