"""/v1/cluster's share figures: room counted only where a share can go.

``gpus.free`` counts whole GPUs a request can get (healthy, not in MIG mode, not
held); ``gpus.share_free_milli`` is the same promise for shares, so the room on a
shared GPU that turned unhealthy, which no new share is given, is not in it.
"""

from __future__ import annotations

from fastapi.testclient import TestClient

from placement import Health
from tests.service.helpers import add_nodes, report


def test_room_on_an_unhealthy_shared_gpu_is_not_free(client: TestClient) -> None:
    snap = add_nodes(client, ("dgx1-v100", "dgx0"))[0]
    first = client.post("/v1/place", json={"gpu_fraction": 0.25})
    assert first.status_code == 201, first.text
    sick = first.json()["tasks"][0]["gpu_indices"][0]
    gpus = [
        g.model_copy(update={"health": Health.UNHEALTHY}) if g.index == sick else g
        for g in snap.gpus
    ]
    assert (
        report(client, snap.model_copy(update={"seq": snap.seq + 1, "gpus": gpus})).status_code
        == 200
    )
    view = client.get("/v1/cluster").json()["gpus"]
    assert view["shared"] == 1 and view["share_free_milli"] == 0, view
    # What the figure promised is what the engine gives: the next share opens a GPU.
    second = client.post("/v1/place", json={"gpu_fraction": 0.25})
    assert second.json()["tasks"][0]["gpu_indices"][0] != sick
    view = client.get("/v1/cluster").json()["gpus"]
    assert view["shared"] == 2 and view["share_free_milli"] == 750, view


def test_a_shared_gpu_the_node_no_longer_reports_is_not_counted(client: TestClient) -> None:
    """``gpus.shared`` counts the GPUs the snapshots list, as ``total`` does: a share on a
    GPU the node no longer reports (its board replaced: another UUID at its index)
    counted one shared GPU the node does not have."""
    snap = add_nodes(client, ("dgx1-v100", "dgx0"))[0]
    placed = client.post("/v1/place", json={"gpu_fraction": 0.25})
    assert placed.status_code == 201, placed.text
    gone = placed.json()["tasks"][0]["gpu_indices"][0]
    gpus = [
        g.model_copy(update={"uuid": "GPU-00000000-0000-0000-0000-0000000000aa"})
        if g.index == gone
        else g
        for g in snap.gpus
    ]
    answer = report(client, snap.model_copy(update={"seq": snap.seq + 1, "gpus": gpus}))
    assert answer.status_code == 200, answer.text
    view = client.get("/v1/cluster").json()["gpus"]
    assert view["total"] == 8 and view["shared"] == 0 and view["share_free_milli"] == 0, view
