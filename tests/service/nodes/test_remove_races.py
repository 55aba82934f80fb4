"""A node deleted and reported again at once on one replica: memory ends as the database
does.

A delete commits, then takes the node out of memory. A first report of the node
committing after the delete, and reaching memory before it, was undone in memory by
the delete's late step: the database had the node, this replica did not serve it, and
on SQLite, which has no resync, it stayed so until the node's next change.
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import NodeSnapshot
from placement.class_registry import Design
from placement.profiles import build_profile
from service import schema
from service.nodes import service
from service.nodes.schemas import SnapshotReport
from service.state import ServiceState
from tests.service.helpers import add_nodes


def _stored(state: ServiceState) -> bool:
    with state.engine.connect() as conn:
        query = sa.select(sa.func.count()).where(schema.nodes.c.name == "h0")
        return bool(conn.execute(query).scalar_one())


def test_a_report_committed_after_a_delete_is_what_memory_keeps(client: TestClient) -> None:
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    errors: list[BaseException] = []

    def delete() -> None:
        try:
            service.remove_node(state, "h0")
        except BaseException as exc:  # seen by the test's thread
            errors.append(exc)

    racing = threading.Thread(target=delete)
    again = build_profile("hgx-h100", "h0").model_copy(update={"seq": snap.seq + 1})
    with state.lock:  # the delete commits, then waits here to reach memory
        racing.start()
        end = time.monotonic() + 10
        while _stored(state):
            assert time.monotonic() < end, "the delete never committed"
            time.sleep(0.01)
        service.report_snapshot(state, "h0", SnapshotReport(snapshot=again))
    racing.join(10)
    assert not racing.is_alive() and not errors, errors
    assert _stored(state)
    assert "h0" in state.cluster
    assert client.get("/v1/nodes/h0").status_code == 200
    placed = client.post("/v1/place", json={"gpus": 1})
    assert placed.status_code == 201, placed.text


def test_a_report_committed_before_a_delete_does_not_bring_the_node_back(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other order: a report commits, the delete commits and reaches memory, then the
    report's memory step runs. It added the deleted node back: shown by GET /v1/nodes,
    counted by /v1/cluster and chosen by /place, whose commit then failed."""
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    committed, deleted = threading.Event(), threading.Event()
    prepare = state.cluster.prepare

    def held_back(snapshot: NodeSnapshot) -> Design:
        committed.set()  # the report's transaction is done; its memory step is next
        assert deleted.wait(10)
        return prepare(snapshot)

    monkeypatch.setattr(state.cluster, "prepare", held_back)
    errors: list[BaseException] = []
    newer = snap.model_copy(update={"seq": snap.seq + 1})

    def report() -> None:
        try:
            service.report_snapshot(state, "h0", SnapshotReport(snapshot=newer))
        except BaseException as exc:  # seen by the test's thread
            errors.append(exc)

    racing = threading.Thread(target=report)
    racing.start()
    assert committed.wait(10)
    service.remove_node(state, "h0")
    deleted.set()
    racing.join(10)
    assert not racing.is_alive() and not errors, errors
    assert not _stored(state)
    assert "h0" not in state.cluster
    assert client.get("/v1/nodes/h0").status_code == 404
