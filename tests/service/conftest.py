"""Service test fixtures: a real database (SQLite file, and Postgres when available).

Postgres: TOPOPLACE_TEST_DATABASE_URL points at a server (CI sets it to the
local one); a fresh database is created for the run and dropped after it.
Without the variable, testcontainers is used if a Docker engine answers;
otherwise the Postgres cases are skipped with a message saying so.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import schema
from service.app import create_app
from service.settings import Settings


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _docker_postgres() -> Iterator[str] | None:
    try:
        import docker  # type: ignore[import-not-found]

        docker.from_env().ping()
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]
    except Exception:
        return None

    def run() -> Iterator[str]:
        with PostgresContainer("postgres:16") as pg:
            yield pg.get_connection_url().replace("psycopg2", "psycopg")

    return run()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    base = os.environ.get("TOPOPLACE_TEST_DATABASE_URL")
    if not base:
        container = _docker_postgres()
        if container is None:
            pytest.skip(
                "Postgres tests skipped: set TOPOPLACE_TEST_DATABASE_URL (e.g."
                " postgresql+psycopg://postgres@127.0.0.1:5432/postgres) or run a Docker engine"
            )
        yield from container
        return
    base = Settings(database_url=base).database_url
    name = f"topoplace_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def doomed_database(postgres_url: str) -> Iterator[tuple[str, sa.Engine]]:
    """A database of its own, so that the test can drop it under a running service."""
    admin = sa.create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    name = f"doomed_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    yield url, admin
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp('db') / 'topoplace.sqlite3'}"
    url: str = request.getfixturevalue("postgres_url")
    _truncate(url)
    return url


def _truncate(url: str) -> None:
    from service import migrate

    migrate.upgrade(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for table in reversed(schema.metadata.sorted_tables):
            conn.execute(table.delete())
    engine.dispose()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def settings(database_url: str) -> Settings:
    return Settings(database_url=database_url, heartbeat_ttl_s=60, reservation_ttl_s=120)


# The admin token the API tests present (a static bootstrap token, insecure mode off).
ADMIN_TOKEN = "test-admin-token-0123456789abcdef"


def secured(settings: Settings) -> Settings:
    """``settings`` with insecure mode off and ``ADMIN_TOKEN`` as the bootstrap admin token."""
    return settings.model_copy(update={"insecure_dev": False, "bootstrap_admin_token": ADMIN_TOKEN})


@pytest.fixture
def client(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    """The API through a real token check, as an admin."""
    app = create_app(secured(settings), clock=clock, background=False)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with TestClient(app, headers=headers) as test_client:
        yield test_client
