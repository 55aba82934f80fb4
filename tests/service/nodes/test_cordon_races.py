"""A cordon and an uncordon of one node racing on one replica: memory ends as the
database does.

Each call writes the node row, commits, then applies itself to memory. Two such
calls can commit in one order and reach memory in the other: the node was left
cordoned in memory while the database had it uncordoned (or the reverse), and on
SQLite, which has no resync, it stayed so: the operator's last word was lost.
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import schema
from service.nodes import service
from service.state import ServiceState
from tests.service.helpers import add_nodes


def _stored(state: ServiceState) -> bool:
    with state.engine.connect() as conn:
        query = sa.select(schema.nodes.c.cordoned).where(schema.nodes.c.name == "h0")
        return bool(conn.execute(query).scalar_one())


def _wait_stored(state: ServiceState, cordoned: bool) -> None:
    end = time.monotonic() + 10
    while _stored(state) != cordoned:
        assert time.monotonic() < end, "the first call never committed"
        time.sleep(0.01)


@pytest.mark.parametrize("first", [True, False], ids=["cordon-first", "uncordon-first"])
def test_the_call_committed_last_is_what_memory_keeps(client: TestClient, first: bool) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    if not first:
        service.set_cordoned(state, "h0", True)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            service.set_cordoned(state, "h0", first)
        except BaseException as exc:  # seen by the test's thread
            errors.append(exc)

    racing = threading.Thread(target=call)
    with state.lock:  # the first call commits, then waits here to reach memory
        racing.start()
        _wait_stored(state, first)
        service.set_cordoned(state, "h0", not first)  # commits second, reaches memory first
    racing.join(10)
    assert not racing.is_alive() and not errors, errors
    assert _stored(state) is (not first)
    assert ("h0" in state.cordoned) is (not first)
    placed = client.post("/v1/place", json={"gpus": 1})
    assert placed.status_code == (409 if first is False else 201), placed.text
