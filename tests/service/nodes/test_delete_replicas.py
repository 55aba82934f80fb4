"""A node deleted through one replica, while another replica behind places on it.

The replica behind has not heard of the delete (its notification is on the way):
its reservation names the node's snapshot it was chosen on, which the delete took
away, so the commit is refused and the request decided again on the stored state.
A node deleted and reported again may carry its old seq with other GPUs (a new
machine under the old name, an agent started afresh): the reservation must then
be refused as well, never commit on UUIDs the node no longer has, whose indices
name the new GPUs another reservation may hold.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service import app as app_module
from service import schema
from service.app import create_app
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes, report


class _Deaf:
    """A notification listener that hears nothing: the replica behind stays behind."""

    def __init__(self, *_: object, **__: object) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture(autouse=True)
def _deaf(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "Listener", _Deaf)


@contextlib.contextmanager
def _replica(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        yield client


def _held(client: TestClient) -> set[tuple[str, str]]:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    holds = schema.gpu_holds
    with state.engine.connect() as conn:
        rows = conn.execute(sa.select(holds.c.node, holds.c.device)).all()
    return {(str(node), str(device)) for node, device in rows}


def test_a_replica_behind_a_delete_places_nothing_on_the_node(
    settings: Settings, clock: FakeClock
) -> None:
    with _replica(settings, clock) as first:
        add_nodes(first, ("hgx-h100", "h0"))
        with _replica(settings, clock) as behind:
            assert first.delete("/v1/nodes/h0").status_code == 204
            placed = behind.post("/v1/place", json={"gpus": 1})
            assert placed.status_code == 409, placed.text
            assert _held(behind) == set()
            assert "h0" not in behind.app.state.service.cluster  # type: ignore[attr-defined]


def test_a_replica_behind_a_delete_and_a_new_report_under_the_old_seq_holds_no_gone_gpu(
    settings: Settings, clock: FakeClock
) -> None:
    old = build_profile("hgx-h100", "h0")
    new = build_profile("hgx-h100", "other").model_copy(update={"name": "h0"})
    assert old.seq == new.seq and {g.uuid for g in old.gpus}.isdisjoint(g.uuid for g in new.gpus)
    with _replica(settings, clock) as first:
        assert report(first, old).status_code == 200
        with _replica(settings, clock) as behind:
            assert first.delete("/v1/nodes/h0").status_code == 204
            clock.advance(1)
            assert report(first, new).status_code == 200
            placed = behind.post("/v1/place", json={"gpus": 1})
            assert placed.status_code == 201, placed.text
            (uuid,) = placed.json()["tasks"][0]["gpu_uuids"]
            assert uuid in {g.uuid for g in new.gpus}, "a GPU the node no longer has"
            assert _held(behind) <= {("h0", g.uuid) for g in new.gpus}
            # So the node's GPU indices are never handed out twice: the first replica
            # finds one GPU of eight taken.
            rest = first.post("/v1/place", json={"gpus": 8, "nodes": ["h0"]})
            assert rest.status_code == 409, rest.text
