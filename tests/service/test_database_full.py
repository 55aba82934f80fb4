"""A SQLite database that cannot grow (disk full, or its page limit reached): writes are
refused with their own code, nothing half-written, memory as the file says."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import database_unreachable
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


class Full:
    """Each connection the service checks out may not grow the file past its size now."""

    def __init__(self) -> None:
        self.on = False

    def checkout(self, dbapi: Any, _record: Any, _proxy: Any) -> None:
        cursor = dbapi.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0] if self.on else 1_073_741_823
        cursor.execute(f"PRAGMA max_page_count={pages}")
        cursor.close()


@pytest.fixture
def full(tmp_path: Path) -> Iterator[tuple[TestClient, Full, sa.Engine]]:
    url = f"sqlite:///{tmp_path / 'full.sqlite3'}"
    app = create_app(Settings(database_url=url), clock=FakeClock(), background=False)
    limit = Full()
    with TestClient(app) as client:
        engine: sa.Engine = app.state.service.engine
        sa.event.listen(engine, "checkout", limit.checkout)
        add_nodes(client, ("hgx-h100", "h0"))
        reader = sa.create_engine(url)
        yield client, limit, reader
        reader.dispose()


def test_a_full_database_refuses_a_placement_as_full_not_as_unreachable(
    full: tuple[TestClient, Full, sa.Engine],
) -> None:
    """Was: 503 database_unavailable, 'the database did not answer', Retry-After 5, for a
    database that answered at once that it had no room: clients retried every 5 s and
    the operator was sent to look for an outage."""
    client, limit, reader = full
    with reader.connect() as conn:
        conn.exec_driver_sql("VACUUM")  # no free page left in the file
    limit.on = True
    placed: list[int] = []  # GPU indices the reservations that fit got
    for n in range(8):  # each adds rows: one soon finds the file full
        response = client.post("/v1/place", json={"gpus": 1, "job_id": f"{n}" * 256})
        if response.status_code != 201:
            break
        placed += response.json()["tasks"][0]["gpu_indices"]
    assert response.status_code == 507, response.text
    error = response.json()["error"]
    assert error["code"] == "database_full"
    assert "space" in error["message"]
    # Nothing happened, and nothing says it did: memory, holds and audit agree.
    assert response.headers.get("Retry-After") is None
    free = client.get("/v1/nodes/h0").json()["free_gpus"]
    assert free == [i for i in range(8) if i not in placed]
    with reader.connect() as conn:
        holds = conn.execute(sa.text("SELECT count(*) FROM gpu_holds")).scalar_one()
        audited = "SELECT count(*) FROM audit_log WHERE action = 'placed'"
        assert holds == conn.execute(sa.text(audited)).scalar_one() == len(placed)
    limit.on = False
    assert client.post("/v1/place", json={"gpus": len(free)}).status_code == 201


def test_postgres_disk_full_is_database_full_and_a_lost_server_is_not() -> None:
    import psycopg.errors

    full = sa.exc.OperationalError("INSERT", {}, psycopg.errors.DiskFull("no space left"))
    assert database_unreachable.unavailable(full).code == "database_full"
    gone = sa.exc.OperationalError("INSERT", {}, psycopg.OperationalError("server closed"))
    assert database_unreachable.unavailable(gone).code == "database_unavailable"
