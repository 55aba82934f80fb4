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
from service.settings import Settings
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
