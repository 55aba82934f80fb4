"""Hostile sequences of lifecycle calls: every answer is a 2xx or a clear 4xx, and
the GPUs held are exactly those of the live allocations."""

from __future__ import annotations

import itertools

from fastapi.testclient import TestClient

from service.allocations import api
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes

LIVE = {"pending", "active", "degraded"}


def _held_consistent(client: TestClient) -> None:
    allocations = client.get("/v1/allocations").json()["allocations"]
    held = [
        (t["node"], i)
        for a in allocations
        if a["state"] in LIVE
        for t in a["tasks"]
        for i in t["gpu_indices"]
    ]
    assert len(held) == len(set(held)), held
    free = len(client.get("/v1/nodes/h0").json()["free_gpus"])
    assert free == 8 - len(held), (free, held, allocations)


def test_every_order_of_lifecycle_calls(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state = client.app.state.service  # type: ignore[attr-defined]
    steps = ["confirm", "extend", "release", "expire", "replay", "job"]
    for order in itertools.permutations(steps, 2):
        key = "k-" + "-".join(order)
        body = {"gpus": 1, "job_id": key, "ttl_s": 5}
        placed = client.post("/v1/place", json=body, headers={"Idempotency-Key": key})
        assert placed.status_code == 201, placed.text
        alloc = placed.json()["id"]
        for step in order:
            if step == "expire":
                clock.advance(10)
                client.post("/v1/nodes/h0/heartbeat")
                api.sweep(state)
                continue
            if step == "replay":
                r = client.post("/v1/place", json=body, headers={"Idempotency-Key": key})
                assert r.status_code == 200 and r.json()["id"] == alloc, r.text
            elif step == "job":
                r = client.post(f"/v1/jobs/{key}/release")
            elif step == "extend":
                r = client.post(f"/v1/allocations/{alloc}/extend", json={"ttl_s": 5})
            else:
                r = client.post(f"/v1/allocations/{alloc}/{step}")
            assert r.status_code < 500, (order, step, r.text)
            if r.status_code >= 400:
                assert r.status_code == 409 and r.json()["error"]["message"], (order, step, r.text)
            _held_consistent(client)
        client.post(f"/v1/allocations/{alloc}/release")
        _held_consistent(client)
