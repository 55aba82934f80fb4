"""When the database goes away: 503 with Retry-After, and nothing half-written."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


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


def test_place_and_readyz_answer_503_when_the_database_is_gone(
    doomed_database: tuple[str, sa.Engine],
) -> None:
    url, admin = doomed_database
    app = create_app(Settings(database_url=url), clock=FakeClock(), background=False)
    with TestClient(app) as client:
        add_nodes(client, ("hgx-h100", "h0"))
        free_before = client.get("/v1/nodes/h0").json()["free_gpus"]
        name = sa.make_url(url).database
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        response = client.post("/v1/place", json={"gpus": 2})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "database_unavailable"
        assert response.headers["Retry-After"] == "5"
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.headers["Retry-After"] == "5"
        # The tentative choice was undone: memory still shows every GPU free.
        state = client.app.state.service  # type: ignore[attr-defined]
        entry = state.cluster.node("h0")
        assert [
            g.index for g in entry.snapshot.gpus if entry.free_mask() >> g.index & 1
        ] == free_before
        with admin.connect() as conn:  # give the fixture a database to drop
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
