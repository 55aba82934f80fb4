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

import pytest

from placement.profiles import build_profile
from service.nodes import service as node_service
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import deaf_listener, held, replica  # noqa: F401
from tests.service.helpers import add_nodes, report

pytestmark = pytest.mark.usefixtures("deaf_listener")


def test_a_replica_behind_a_delete_places_nothing_on_the_node(
    settings: Settings, clock: FakeClock
) -> None:
    with replica(settings, clock) as first:
        add_nodes(first, ("hgx-h100", "h0"))
        with replica(settings, clock) as behind:
            assert first.delete("/v1/nodes/h0").status_code == 204
            placed = behind.post("/v1/place", json={"gpus": 1})
            assert placed.status_code == 409, placed.text
            assert held(behind) == set()
            assert "h0" not in behind.app.state.service.cluster  # type: ignore[attr-defined]


def test_a_replica_behind_a_delete_and_a_new_report_under_the_old_seq_holds_no_gone_gpu(
    settings: Settings, clock: FakeClock
) -> None:
    old = build_profile("hgx-h100", "h0")
    new = build_profile("hgx-h100", "other").model_copy(update={"name": "h0"})
    assert old.seq == new.seq and {g.uuid for g in old.gpus}.isdisjoint(g.uuid for g in new.gpus)
    with replica(settings, clock) as first:
        assert report(first, old).status_code == 200
        with replica(settings, clock) as behind:
            assert first.delete("/v1/nodes/h0").status_code == 204
            clock.advance(1)
            assert report(first, new).status_code == 200
            placed = behind.post("/v1/place", json={"gpus": 1})
            assert placed.status_code == 201, placed.text
            (uuid,) = placed.json()["tasks"][0]["gpu_uuids"]
            assert uuid in {g.uuid for g in new.gpus}, "a GPU the node no longer has"
            assert held(behind) <= {("h0", g.uuid) for g in new.gpus}
            # So the node's GPU indices are never handed out twice: the first replica
            # finds one GPU of eight taken.
            rest = first.post("/v1/place", json={"gpus": 8, "nodes": ["h0"]})
            assert rest.status_code == 409, rest.text


@pytest.mark.parametrize("call", ["GET", "cordon", "uncordon"])
def test_a_node_deleted_while_a_replica_reads_it_is_not_found(
    settings: Settings, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """The node view is read in two holds of the state lock, the database read between
    them; a delete through another replica, heard here meanwhile (the listener, a
    resync), took the node out of memory in between, and the view answered 500."""
    with replica(settings, clock) as first:
        add_nodes(first, ("hgx-h100", "h0"))
        with replica(settings, clock) as behind:
            state: ServiceState = behind.app.state.service  # type: ignore[attr-defined]
            read = node_service._allocations_by_node

            def deleted_meanwhile(
                state_: ServiceState, names: list[str] | None
            ) -> dict[str, list[str]]:
                found = read(state_, names)
                assert first.delete("/v1/nodes/h0").status_code == 204
                state.sync_nodes(["h0"])  # what the notification makes this replica do
                return found

            monkeypatch.setattr(node_service, "_allocations_by_node", deleted_meanwhile)
            if call == "GET":
                answer = behind.get("/v1/nodes/h0")
            else:
                answer = behind.post(f"/v1/nodes/h0/{call}")
            assert answer.status_code == 404, answer.text
            assert answer.json()["error"]["code"] == "not_found"
