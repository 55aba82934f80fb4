"""A `topoplace db upgrade` of an SQLite file killed (SIGKILL) half-way leaves the
old schema whole: the next upgrade runs from it and succeeds."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from service import migrate, schema

# Delays after the upgrade is first seen writing; the pending migrations take about
# 0.3 s in all, so these kills land before, among and after them.
KILL_AFTER_S = (0.0, 0.03, 0.08, 0.15, 0.25)


@pytest.mark.parametrize("journal_mode", ["delete", "wal"])
def test_a_killed_upgrade_leaves_the_old_schema_whole(tmp_path: Path, journal_mode: str) -> None:
    killed = 0
    for attempt, delay in enumerate(KILL_AFTER_S):
        path = tmp_path / f"attempt{attempt}.sqlite3"
        with sqlite3.connect(path) as conn:
            conn.execute(f"PRAGMA journal_mode={journal_mode}")
        upgrade = subprocess.Popen(
            [sys.executable, "-m", "topoplace", "db", "upgrade"],
            env={**os.environ, "TOPOPLACE_DATABASE_URL": f"sqlite:///{path}"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            if _wait_until_writing(path, upgrade):
                time.sleep(delay)
                upgrade.send_signal(signal.SIGKILL)
        finally:
            returncode = upgrade.wait(timeout=30)
        killed += returncode == -signal.SIGKILL
        url = f"sqlite:///{path}"
        assert _schema(url) in (_OLD, _NEW), (delay, _schema(url))
        migrate.upgrade(url)
        assert _schema(url) == _NEW
    assert killed >= 3, "the upgrades finished before they could be killed"


_OLD: tuple[str | None, frozenset[str]] = (None, frozenset())


def _new() -> tuple[str | None, frozenset[str]]:
    return migrate.current_head(), frozenset(
        {"alembic_version"} | {t.name for t in schema.metadata.sorted_tables}
    )


_NEW = _new()


def _schema(url: str) -> tuple[str | None, frozenset[str]]:
    """(the revision stamped, the tables there), as another process reads them."""
    engine = sa.create_engine(url)
    try:
        tables = frozenset(sa.inspect(engine).get_table_names())
        version = None
        if "alembic_version" in tables:
            with engine.connect() as conn:
                version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
        if tables == {"alembic_version"} and version is None:
            tables = frozenset()  # an empty version table is the old schema too
        return version, tables
    finally:
        engine.dispose()


def _wait_until_writing(path: Path, upgrade: subprocess.Popen[bytes]) -> bool:
    """Poll until some other connection holds the file's write lock (the upgrade has
    begun writing); False if the upgrade ended first."""
    probe = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        deadline = time.monotonic() + 30
        while upgrade.poll() is None and time.monotonic() < deadline:
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc):
                    return True
                raise
            time.sleep(0.001)
        return False
    finally:
        probe.close()
