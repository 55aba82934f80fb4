"""A keyed /place retried after its reservation's TTL passed, before the sweep ran: the
replay expires the reservation first and answers it expired, as a replay after the
sweep does, so the client never believes it holds GPUs the next sweep gives away."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from service.allocations import api
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes

BODY = {"gpus": 8, "ttl_s": 10}


def _state(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def _place(client: TestClient, key: str) -> dict[str, Any]:
    first = client.post("/v1/place", json=BODY, headers={"Idempotency-Key": key})
    assert first.status_code == 201, first.text
    answer: dict[str, Any] = first.json()
    return answer


def test_a_replay_past_the_ttl_expires_the_reservation(
    client: TestClient, clock: FakeClock
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    # The answer a replay gets once the sweep has expired the reservation.
    swept = _place(client, "swept")
    clock.advance(11)
    assert api.sweep(_state(client)).ids == (swept["id"],)
    after_sweep = client.post("/v1/place", json=BODY, headers={"Idempotency-Key": "swept"})
    assert after_sweep.json()["state"] == "expired"
    # The same, with the sweep not run yet.
    first = _place(client, "late-retry")
    clock.advance(11)
    again = client.post("/v1/place", json=BODY, headers={"Idempotency-Key": "late-retry"})
    assert again.status_code == after_sweep.status_code == 200, again.text
    assert again.headers["Idempotent-Replayed"] == "true"
    replayed = again.json()
    assert replayed["id"] == first["id"]
    assert replayed["state"] == "expired" and replayed["ended_at"] is not None
    stored = client.get(f"/v1/allocations/{first['id']}").json()
    assert stored["state"] == "expired"
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 8
    # Its GPUs are free: another request gets them, and the sweep finds nothing left.
    other = client.post("/v1/place", json={"gpus": 8})
    assert other.status_code == 201, other.text
    assert api.sweep(_state(client)).ids == ()
    # The expiry was recorded as the sweep records one.
    kinds = [
        e["action"]
        for e in client.get("/v1/audit").json()["entries"]
        if e.get("allocation_id") == first["id"]
    ]
    assert kinds.count("expired") == 1


def test_a_replay_within_the_ttl_keeps_the_reservation(
    client: TestClient, clock: FakeClock
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    first = _place(client, "in-time")
    clock.advance(9)
    again = client.post("/v1/place", json=BODY, headers={"Idempotency-Key": "in-time"})
    assert again.status_code == 200 and again.json()["state"] == "pending"
    assert client.get("/v1/nodes/h0").json()["free_gpus"] == []
    assert api.sweep(_state(client)).ids == ()
    assert client.get(f"/v1/allocations/{first['id']}").json()["state"] == "pending"
