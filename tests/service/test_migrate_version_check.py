"""`topoplace serve --no-migrate` on a schema other than its code's refuses to start:
exit 2 and one line naming the database's revision, the one needed and what to run."""

from __future__ import annotations

import os
import subprocess
import sys

import sqlalchemy as sa
from alembic import command

from service import migrate
from tests.service import replica_processes
from tests.service.replica_processes import free_port


def _serve_no_migrate(database_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "topoplace",
            "serve",
            "--no-migrate",
            "--insecure-dev",
            "--no-grpc",
            "--port",
            str(free_port()),
        ],
        env={**os.environ, "TOPOPLACE_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _stamp(database_url: str, revision: str) -> None:
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": revision})
    engine.dispose()


def test_a_schema_behind_the_code_is_refused_with_what_to_run(database_url: str) -> None:
    migrate.upgrade(database_url)
    command.downgrade(migrate.alembic_config(database_url), "0010")
    try:
        done = _serve_no_migrate(database_url)
        head = migrate.current_head()
        assert done.returncode == 2, done.stderr
        assert done.stderr.splitlines() == [
            f"error: the database's schema is at revision 0010 and this code needs {head}:"
            " run `topoplace db upgrade`, or let serve migrate (drop --no-migrate,"
            " TOPOPLACE_MIGRATE_ON_START=false)"
        ]
    finally:
        migrate.upgrade(database_url)


def test_a_schema_ahead_of_the_code_is_refused(database_url: str) -> None:
    migrate.upgrade(database_url)
    _stamp(database_url, "9999")  # a newer topoplace's migration
    try:
        done = _serve_no_migrate(database_url)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith("error: the database's schema is at revision 9999, which this")
        assert f"this code needs {migrate.current_head()}" in line
    finally:
        _stamp(database_url, migrate.current_head())


def test_no_schema_at_all_is_refused(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/empty.sqlite3"
    done = _serve_no_migrate(url)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert "the database has no schema yet" in line and "topoplace db upgrade" in line


def test_the_code_s_own_schema_serves(database_url: str) -> None:
    migrate.upgrade(database_url)
    assert migrate.schema_mismatch(database_url) is None
    url, proc = replica_processes.start(database_url, {"TOPOPLACE_MIGRATE_ON_START": "false"})
    try:
        replica_processes.wait_ready(url, proc)
    finally:
        replica_processes.stop(proc)
