"""Every pooled connection busy past the pool's wait: 503 with Retry-After, not a fault.

A request that reads the database waits for a connection of the engine's pool
(15 on SQLite, 20 on Postgres) while FastAPI runs 40 at once; past the pool's
wait (30 s) SQLAlchemy raises its TimeoutError, which no handler knew: the
caller was answered 500 internal_error ("the service failed"), and a scheduler
retrying on 5xx could not tell an overload from a fault. Here every connection
is held, as slow reads hold them, and the pool's wait is shortened so the test
does not sit through 30 s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.pool import QueuePool

from service.app import create_app
from service.grpc.status_map import from_exception
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.helpers import add_nodes


@pytest.fixture
def held(settings: Settings) -> Iterator[tuple[TestClient, list[Any]]]:
    """A service whose engine's pool has every connection checked out and held."""
    app = create_app(secured(settings), background=False)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with TestClient(app, headers=headers) as client:
        add_nodes(client, ("hgx-h100", "h0"))
        placed = client.post("/v1/place", json={"gpus": 1})
        assert placed.status_code == 201
        engine: sa.Engine = app.state.service.engine
        pool = engine.pool
        assert isinstance(pool, QueuePool)
        pool._timeout = 0.5  # the wait for a connection (30 s by default), kept short here
        connections = [pool.connect() for _ in range(pool.size() + pool._max_overflow)]
        try:
            yield client, connections
        finally:
            for connection in connections:
                connection.close()


def test_a_read_waiting_past_the_pools_wait_is_answered_503(
    held: tuple[TestClient, list[Any]],
) -> None:
    client, _ = held
    for method, path in (
        ("GET", "/v1/allocations"),
        ("GET", "/v1/audit"),
        ("POST", "/v1/jobs/j1/release"),
    ):
        response = client.request(method, path)
        assert response.status_code == 503, (path, response.text)
        assert response.json()["error"]["code"] == "database_unavailable"
        assert response.headers["Retry-After"] == "5"
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.headers["Retry-After"] == "5"


def test_the_connections_given_back_the_same_requests_are_answered(
    held: tuple[TestClient, list[Any]],
) -> None:
    client, connections = held
    assert client.get("/v1/allocations").status_code == 503
    connections.pop().close()
    listed = client.get("/v1/allocations")
    assert listed.status_code == 200 and len(listed.json()["allocations"]) == 1


def test_grpc_tells_a_pool_wait_as_unavailable() -> None:
    reply = from_exception(sa.exc.TimeoutError("QueuePool limit of size 10 overflow 10 reached"))
    assert reply.reason == "database_unavailable"
    assert reply.code.name == "UNAVAILABLE"
