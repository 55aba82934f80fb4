"""The in-memory state follows the database: a chunked resync sees what other processes wrote."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import class_registry
from placement.profiles import build_profile
from service import schema
from service.allocations import api, repository
from service.allocations.place_flow import Commit, blocking_step
from service.allocations.schemas import PlaceRequest
from service.app import create_app
from service.settings import Settings
from service.state import PREPARE_TRIES, ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes, report


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
            busy = state.cluster.node("h3").held_gpus
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
            repository.end(conn, None, "release", clock.now)
        engine.dispose()
        assert len(state.cluster.node("h0").held_gpus) == 8
        state.resync(chunk=1)
        assert state.cluster.node("h0").held_gpus == set()


def test_resync_takes_heartbeats_without_syncing_unchanged_nodes(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        add_nodes(client, *[("hgx-h100", f"h{i}") for i in range(4)])
        client.post("/v1/place", json={"gpus": 3, "nodes": ["h2"]})
        state = client.app.state.service
        clock.advance(settings.heartbeat_ttl_s + 1)
        state.refresh_availability()
        assert client.post("/v1/place", json={"gpus": 1}).status_code == 409  # all stale
        # Another replica took the agents' heartbeats; one node changed besides.
        engine = sa.create_engine(settings.database_url)
        with engine.begin() as conn:
            conn.execute(sa.update(schema.nodes).values(heartbeat_at=clock.now))
            conn.execute(
                sa.update(schema.nodes).where(schema.nodes.c.name == "h3").values(cordoned=True)
            )
        engine.dispose()
        synced: list[list[str]] = []
        real_sync = state.sync_nodes
        monkeypatch.setattr(
            state, "sync_nodes", lambda names: synced.append(names) or real_sync(names)
        )
        state.resync(chunk=2)
        assert synced == [["h3"]]  # the others only took their heartbeat
        assert all(state.heartbeats[f"h{i}"] == clock.now for i in range(4))
        assert "h3" in state.cordoned
        placed = client.post("/v1/place", json={"gpus": 8})
        assert placed.status_code == 201, placed.text
        assert placed.json()["tasks"][0]["node"] in ("h0", "h1")
        assert len(state.cluster.node("h2").held_gpus) == 3


@pytest.mark.parametrize("catch_up", ["sync_nodes", "resync"])
def test_a_node_deleted_and_reported_again_under_its_old_seq_is_reloaded(
    settings: Settings, clock: FakeClock, catch_up: str
) -> None:
    """A deleted node's next first report may carry the old seq with other GPUs: a replica
    that did not see the delete (its notifications came together) kept the old GPUs and
    placed jobs on UUIDs the node no longer has."""
    old = build_profile("hgx-h100", "h0")
    new = build_profile("hgx-h100", "other").model_copy(update={"name": "h0"})
    with TestClient(create_app(settings, clock=clock, background=False)) as writer:
        assert report(writer, old).status_code == 200
        with TestClient(create_app(settings, clock=clock, background=False)) as reader:
            assert writer.delete("/v1/nodes/h0").status_code == 204
            clock.advance(1)
            assert report(writer, new).status_code == 200
            state = reader.app.state.service
            if catch_up == "sync_nodes":
                state.sync_nodes(["h0"])  # both notifications at once
            else:
                state.resync()
            assert state.cluster.node("h0").snapshot.gpus == new.gpus
            placed = reader.post("/v1/place", json={"gpus": 1})
            assert placed.json()["tasks"][0]["gpu_uuids"][0] in {g.uuid for g in new.gpus}
            # The same on the reporting side: the reader deletes and reports the old one
            # again; the writer, told nothing, takes the old one back when its agent sends it.
            assert reader.post(f"/v1/allocations/{placed.json()['id']}/release").status_code == 200
            assert reader.delete("/v1/nodes/h0").status_code == 204
            clock.advance(1)
            assert report(reader, old).status_code == 200
            assert report(writer, old).status_code == 200
            assert writer.app.state.service.cluster.node("h0").snapshot.gpus == old.gpus


@pytest.mark.parametrize(
    "body",
    [{"gpus": 2, "job_id": "j"}, {"gpu_fraction": 0.5, "job_id": "j"}],
    ids=["whole", "share"],
)
def test_a_sync_that_this_process_commit_lands_in_keeps_its_devices_busy(
    client: TestClient, body: dict[str, Any]
) -> None:
    """A sync (another replica's notification for the node: a cordon, a report, a
    release) runs while this process commits a reservation there, and the commit lands
    between the sync's reads. No notification of its own follows (a replica skips its
    own), so whatever the sync leaves in memory stays until the next full resync."""
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    flow = api.placing(state, PlaceRequest.model_validate(body), None)
    step = next(flow)
    while not isinstance(step, Commit):  # chosen and applied in memory, not yet stored
        step = flow.send(blocking_step(state, False, step))
    landed: list[bool] = []

    def commit_after_the_holds_read(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if "gpu_holds" in statement and not landed:
            landed.append(True)
            blocking_step(state, False, step)  # the group committer's thread writes it

    sa.event.listen(state.engine, "after_cursor_execute", commit_after_the_holds_read)
    try:
        state.sync_nodes(["h0"])
    finally:
        sa.event.remove(state.engine, "after_cursor_execute", commit_after_the_holds_read)
    assert landed
    with pytest.raises(StopIteration) as done:
        flow.send(None)  # the commit's outcome: the flow ends its in-flight marks
    task = done.value.value.allocation.tasks[0]
    with state.lock:
        node = state.cluster.node("h0")
        busy, shares = set(node.held_gpus), dict(node.shares)
    if "gpus" in body:
        assert busy == set(task.gpu_uuids), "memory shows the reservation's GPUs free"
    else:
        assert shares == {task.gpu_uuids[0]: 500}, "memory shows the reservation's share free"
    view = client.get("/v1/nodes/h0").json()
    assert len(view["free_gpus"]) == 8 - (2 if "gpus" in body else 1)


class _Builds:
    """Every build of a design's tables, and whether ``lock`` was held by its thread."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.under_lock: list[bool] = []
        self.lock: Any = None
        build = class_registry.build_class

        def watched(*args: Any, **kwargs: Any) -> Any:
            self.under_lock.append(self.lock is not None and self.lock._is_owned())
            return build(*args, **kwargs)

        monkeypatch.setattr(class_registry, "build_class", watched)


def test_a_reported_new_design_is_built_outside_the_state_lock(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A design's tables take 0.6 s for 16 GPUs: built under the state lock, every
    # /place and /score of the replica waited for them.
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        state = client.app.state.service
        add_nodes(client, ("hgx-h100", "h0"))
        builds = _Builds(monkeypatch)
        builds.lock = state.lock
        assert report(client, build_profile("dgx1-v100", "v0")).status_code == 200
        assert builds.under_lock and not any(builds.under_lock)
        assert client.post("/v1/place", json={"gpus": 4, "nodes": ["v0"]}).status_code == 201


def test_a_new_design_synced_from_the_database_is_built_outside_the_state_lock(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(settings, clock=clock, background=False)) as writer:
        add_nodes(writer, ("hgx-h100", "h0"))
        with TestClient(create_app(settings, clock=clock, background=False)) as reader:
            state = reader.app.state.service
            add_nodes(writer, ("dgx1-v100", "v0"))  # another replica's report
            builds = _Builds(monkeypatch)
            builds.lock = state.lock
            state.sync_nodes(["v0"])
            assert builds.under_lock == [False]
            assert state.cluster.node("v0").snapshot == build_profile("dgx1-v100", "v0")
            assert reader.post("/v1/place", json={"gpus": 4, "nodes": ["v0"]}).status_code == 201


def test_a_snapshot_that_keeps_moving_is_loaded_after_bounded_passes(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TestClient(create_app(settings, clock=clock, background=False)) as writer:
        add_nodes(writer, ("hgx-h100", "h0"))
        with TestClient(create_app(settings, clock=clock, background=False)) as reader:
            state = reader.app.state.service
            prepare = state._prepare
            seqs = iter(range(1, 100))
            passes: list[int] = []

            def racing(*args: Any) -> None:
                # Another replica stores a newer snapshot after every preparation here.
                prepare(*args)
                passes.append(1)
                report(writer, build_profile("dgx1-v100", "v0", seq=next(seqs)))

            report(writer, build_profile("dgx1-v100", "v0"))
            monkeypatch.setattr(state, "_prepare", racing)
            state.sync_nodes(["v0"])
            assert len(passes) == PREPARE_TRIES - 1
            assert state.cluster.node("v0").snapshot.seq == PREPARE_TRIES - 1
            assert reader.post("/v1/place", json={"gpus": 4, "nodes": ["v0"]}).status_code == 201
