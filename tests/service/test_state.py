"""The in-memory state follows the database: a chunked resync sees what other processes wrote."""

from __future__ import annotations

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import schema
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


def test_resync_in_chunks_matches_the_database(settings: Settings, clock: FakeClock) -> None:
    with TestClient(create_app(settings, clock=clock, background=False)) as writer:
        add_nodes(writer, *[("hgx-h100", f"h{i}") for i in range(5)])
        with TestClient(create_app(settings, clock=clock, background=False)) as reader:
            state = reader.app.state.service
            assert sorted(state.cluster.names()) == [f"h{i}" for i in range(5)]
            # Another process: places 4 GPUs, adds a node, removes one.
            placed = writer.post("/v1/place", json={"gpus": 4, "nodes": ["h3"]}).json()
            add_nodes(writer, ("dgx1-v100", "v0"))
            assert writer.delete("/v1/nodes/h1").status_code == 204
            state.resync(chunk=2)
            assert sorted(state.cluster.names()) == ["h0", "h2", "h3", "h4", "v0"]
            busy = state.cluster.node("h3").busy
            assert busy == set(placed["tasks"][0]["gpu_uuids"])
            # And the reader's own decisions now avoid what the writer holds.
            mine = reader.post("/v1/place", json={"gpus": 8, "nodes": ["h3"]})
            assert mine.status_code == 409


def test_resync_drops_holds_released_elsewhere(settings: Settings, clock: FakeClock) -> None:
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        add_nodes(client, ("hgx-h100", "h0"))
        client.post("/v1/place", json={"gpus": 8})
        state = client.app.state.service
        engine = sa.create_engine(settings.database_url)
        with engine.begin() as conn:  # what a release by another replica leaves behind
            conn.execute(sa.delete(schema.gpu_holds))
        engine.dispose()
        assert len(state.cluster.node("h0").busy) == 8
        state.resync(chunk=1)
        assert state.cluster.node("h0").busy == set()
