"""When the database goes away: 503 with Retry-After, and nothing half-written."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


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
            g.index for g in entry.snapshot.gpus if entry.free_mask >> g.index & 1
        ] == free_before
        with admin.connect() as conn:  # give the fixture a database to drop
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
