"""The expiry sweep runs ten times a second: when nothing is due it must not write.

Its write would take SQLite's one write lock (and on Postgres a lock on the
table) every round, and a bind's or a Slurm submission's at-once write that
meets that lock goes to the group committer's queue instead. Each test holds
a lock that stops writers but not readers, as a long write elsewhere would.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.allocations import api
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


@contextmanager
def _writers_held(engine: sa.Engine) -> Iterator[None]:
    """Another connection holds what an UPDATE of allocations needs; reads still pass."""
    if engine.dialect.name == "sqlite":
        path = engine.url.database
        assert path is not None
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # SQLite's write lock
        try:
            yield
        finally:
            other.execute("ROLLBACK")
            other.close()
        return
    with engine.connect() as conn, conn.begin():
        # EXCLUSIVE stops UPDATE (ROW EXCLUSIVE) and lets SELECT (ACCESS SHARE) through.
        conn.execute(sa.text("LOCK TABLE allocations IN EXCLUSIVE MODE"))
        yield


def _sweep_within(state: ServiceState, seconds: float) -> tuple[str, ...] | None:
    """The sweep's ended ids, or None when it was still waiting after ``seconds``."""
    done: list[tuple[str, ...]] = []
    worker = threading.Thread(target=lambda: done.append(api.sweep(state).ids), daemon=True)
    worker.start()
    worker.join(seconds)
    return done[0] if done else None


def _state(client: TestClient) -> ServiceState:
    return client.app.state.service  # type: ignore[attr-defined,no-any-return]


def test_a_sweep_with_nothing_due_does_not_wait_on_a_writer(
    client: TestClient, clock: FakeClock
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    assert client.post("/v1/place", json={"gpus": 2, "ttl_s": 300}).status_code == 201
    clock.advance(10)  # a live reservation, not yet due
    state = _state(client)

    with _writers_held(state.engine):
        assert _sweep_within(state, 2.0) == ()


def test_a_due_reservation_is_still_expired_once_the_writer_is_done(
    client: TestClient, clock: FakeClock
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    lapsing = client.post("/v1/place", json={"gpus": 2, "ttl_s": 30}).json()["id"]
    clock.advance(31)
    state = _state(client)

    with _writers_held(state.engine):
        assert _sweep_within(state, 0.5) is None  # due: the sweep writes, so it waits
    assert _sweep_within(state, 10.0) in ((), (lapsing,))
    assert client.get(f"/v1/allocations/{lapsing}").json()["state"] == "expired"
