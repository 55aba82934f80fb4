"""A report taken by a replica whose memory of the node's holds is not the database's."""

from __future__ import annotations

import pytest

from placement import NodeSnapshot
from placement.profiles import build_profile
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import deaf_listener, replica  # noqa: F401
from tests.service.helpers import report

pytestmark = pytest.mark.usefixtures("deaf_listener")


def _without_last_gpu(snap: NodeSnapshot, seq: int) -> NodeSnapshot:
    n = snap.gpu_count - 1
    data = snap.model_dump(mode="json")
    data["gpus"] = data["gpus"][:n]
    data["links"] = [row[:n] for row in data["links"][:n]]
    data["nics"] = [{**nic, "links": nic["links"][:n]} for nic in data["nics"]]
    data["cpu_links"] = [c for c in data["cpu_links"] if c["gpu"] < n]
    data["seq"] = seq
    return NodeSnapshot.model_validate(data)


def test_a_held_gpu_back_after_a_restart_is_not_shown_free(
    settings: Settings, clock: FakeClock
) -> None:
    """A GPU that fell off its node keeps its degraded allocation's hold (the job may
    still run on it). A replica started while it was gone has no hold of it in memory;
    when the node reports the GPU again to that replica, the hold must come with it."""
    snap = build_profile("hgx-h100", "h0")
    with replica(settings, clock) as first:
        assert report(first, snap).status_code == 200
        placed = first.post("/v1/place", json={"gpus": 8})
        assert placed.status_code == 201, placed.text
        assert report(first, _without_last_gpu(snap, snap.seq + 1)).status_code == 200
        assert first.get(f"/v1/allocations/{placed.json()['id']}").json()["state"] == "degraded"
    with replica(settings, clock) as restarted:
        back = report(restarted, snap.model_copy(update={"seq": snap.seq + 2}))
        assert back.status_code == 200, back.text
        assert restarted.get("/v1/nodes/h0").json()["free_gpus"] == []
        assert restarted.get("/v1/cluster").json()["gpus"]["free"] == 0
