"""Two upgrades of one fresh database at once (two replicas starting together): the
second waits for the first, then finds nothing to do; both succeed. Postgres by an
advisory lock, SQLite by its write lock (migrations/env.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from service import migrate, schema

ROUNDS = 3  # each on a fresh database: the two starts drift apart by tenths of a second


@pytest.fixture(params=["sqlite", "postgres"])
def fresh_databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[list[str]]:
    if request.param == "sqlite":
        yield [f"sqlite:///{tmp_path / f'round{i}.sqlite3'}" for i in range(ROUNDS)]
        return
    postgres_url: str = request.getfixturevalue("postgres_url")
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    names = [f"upgrade_{uuid.uuid4().hex[:8]}" for _ in range(ROUNDS)]
    with admin.connect() as conn:
        for name in names:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    base = sa.make_url(postgres_url)
    try:
        yield [base.set(database=n).render_as_string(hide_password=False) for n in names]
    finally:
        with admin.connect() as conn:
            for name in names:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_two_upgrades_at_once_both_succeed(fresh_databases: list[str]) -> None:
    for url in fresh_databases:
        upgrades = [
            subprocess.Popen(
                [sys.executable, "-m", "topoplace", "db", "upgrade"],
                env={**os.environ, "TOPOPLACE_DATABASE_URL": url},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for upgrade in upgrades:
            _, err = upgrade.communicate(timeout=120)
            assert upgrade.returncode == 0, err[-2000:]
        assert migrate.schema_mismatch(url) is None
        engine = sa.create_engine(url)
        try:
            tables = set(sa.inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert tables == {"alembic_version"} | {t.name for t in schema.metadata.sorted_tables}
