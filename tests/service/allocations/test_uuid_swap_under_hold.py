"""A node reports two GPUs' UUIDs swapped (a driver reload renumbers them) while one is
held: the held device stays held under its UUID, on this process and a new one."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.helpers import add_nodes, report


def test_a_held_uuid_that_changes_index_is_never_given_again(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    held = client.post("/v1/place", json={"gpus": 1}).json()
    uuid = held["tasks"][0]["gpu_uuids"][0]
    index = held["tasks"][0]["gpu_indices"][0]
    other = (index + 1) % len(snap.gpus)
    uuids = {g.index: g.uuid for g in snap.gpus}
    uuids[index], uuids[other] = uuids[other], uuids[index]
    gpus = [g.model_copy(update={"uuid": uuids[g.index]}) for g in snap.gpus]
    assert report(client, snap.model_copy(update={"seq": 1, "gpus": gpus})).status_code == 200
    app = create_app(secured(settings), clock=clock, background=False)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with TestClient(app, headers=headers) as restarted:
        for replica in (client, restarted):
            rest = replica.post("/v1/place", json={"gpus": len(snap.gpus) - 1, "nodes": ["h0"]})
            given = rest.json()["tasks"][0]["gpu_uuids"] if rest.status_code == 201 else []
            assert uuid not in given, (replica is client, rest.text[:300])
            if rest.status_code == 201:
                replica.post(f"/v1/allocations/{rest.json()['id']}/release")
    # The index the held UUID now has is the busy one, the index it had is free.
    assert index in client.get("/v1/nodes/h0").json()["free_gpus"]
    assert other not in client.get("/v1/nodes/h0").json()["free_gpus"]
