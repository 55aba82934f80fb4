"""A GPU held whole (or in a share) that turns to MIG mode with instances: its
instances are not given to anyone while the hold lives, on this process or another."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from placement import NodeSnapshot
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.helpers import add_nodes, report


def _turned_mig(snap: NodeSnapshot, uuid: str) -> NodeSnapshot:
    """``snap`` with GPU ``uuid`` in MIG mode, split as its first MIG GPU is."""
    gpu = next(g for g in snap.gpus if g.uuid == uuid)
    model = next(g for g in snap.gpus if g.mig_enabled)
    extra = [
        m.model_copy(update={"uuid": f"MIG-new-{i:04d}", "parent_gpu": gpu.index})
        for i, m in enumerate(m for m in snap.mig_instances if m.parent_gpu == model.index)
    ]
    gpus = [
        g.model_copy(update={"mig_enabled": g.mig_enabled or g.uuid == uuid}) for g in snap.gpus
    ]
    return snap.model_copy(
        update={"seq": snap.seq + 1, "gpus": gpus, "mig_instances": [*snap.mig_instances, *extra]}
    )


@pytest.mark.parametrize("asked", [{"gpus": 1}, {"gpu_fraction": 0.5}])
def test_instances_of_a_gpu_held_whole_are_not_given(
    client: TestClient, settings: Settings, clock: FakeClock, asked: dict[str, object]
) -> None:
    (snap,) = add_nodes(client, ("dgx-a100-mig", "m0"))
    held = client.post("/v1/place", json={**asked, "nodes": ["m0"]})
    assert held.status_code == 201, held.text
    parent = held.json()["tasks"][0]["gpu_uuids"][0]
    assert report(client, _turned_mig(snap, parent)).status_code == 200
    assert client.get(f"/v1/allocations/{held.json()['id']}").json()["state"] == "degraded"
    app = create_app(secured(settings), clock=clock, background=False)
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with TestClient(app, headers=headers) as restarted:
        for replica in (client, restarted):
            parents = []
            for _ in range(64):
                given = replica.post("/v1/place", json={"mig_profile": "1g.10gb"})
                if given.status_code != 201:
                    break
                parents.append(given.json()["tasks"][0]["gpu_uuids"][0])
            assert parents and parent not in parents
            for allocation in replica.get("/v1/allocations?state=pending").json()["allocations"]:
                if allocation["id"] != held.json()["id"]:
                    replica.post(f"/v1/allocations/{allocation['id']}/release")
    # Once the hold ends, its instances serve: the check above could have failed.
    assert client.post(f"/v1/allocations/{held.json()['id']}/release").status_code == 200
    given = [client.post("/v1/place", json={"mig_profile": "1g.10gb"}) for _ in range(64)]
    assert parent in [g.json()["tasks"][0]["gpu_uuids"][0] for g in given if g.status_code == 201]
