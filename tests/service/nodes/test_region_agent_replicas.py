"""A region-scoped agent reports only nodes its region holds, as the database says.

The token check runs before the report, against the replica's memory: another
replica may have moved the node to another region (an admin's report) and this
one not heard of it yet, or the move may commit between the check and the write.
The report's own transaction checks the stored region again.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from agent.signing import NodeKey
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _signed(name: str, region: str, seq: int, key: NodeKey) -> dict[str, Any]:
    snap = build_profile("hgx-h100", name, region=region, seq=seq)
    body: dict[str, Any] = {"snapshot": snap.model_dump(mode="json")}
    body["signature"] = key.sign(body["snapshot"])
    return body


def _replica(settings: Settings, clock: FakeClock) -> Any:
    """A replica without its background loop: it hears of no other replica's change."""
    trusting = secured(settings.model_copy(update={"trust_on_first_use": True}))
    return create_app(trusting, clock=clock, background=False)


def test_a_node_moved_out_of_a_region_on_one_replica_is_refused_to_its_agent_on_another(
    settings: Settings, clock: FakeClock
) -> None:
    key = NodeKey.generate()
    with TestClient(_replica(settings, clock), headers=ADMIN) as first:
        created = first.post("/v1/tokens", json={"role": "agent", "region": "us"})
        assert created.status_code == 201, created.text
        agent = {"Authorization": f"Bearer {created.json()['token']}"}
        registered = first.put("/v1/nodes/n1/key", json={"public_key": key.public_key})
        assert registered.status_code == 200, registered.text
        answer = first.put("/v1/nodes/n1/snapshot", json=_signed("n1", "us", 1, key))
        assert answer.status_code == 200, answer.text
        with TestClient(_replica(settings, clock)) as second:
            behind: ServiceState = second.app.state.service  # type: ignore[attr-defined]
            assert behind.cluster.node("n1").snapshot.region == "us"
            # An admin moves the node to another region, through the first replica.
            moved = first.put("/v1/nodes/n1/snapshot", json=_signed("n1", "eu", 2, key))
            assert moved.status_code == 200, moved.text
            # The second replica's memory still has the node in "us".
            assert behind.cluster.node("n1").snapshot.region == "us"
            back = second.put(
                "/v1/nodes/n1/snapshot", json=_signed("n1", "us", 3, key), headers=agent
            )
            assert back.status_code == 403, back.text
            assert back.json()["error"]["code"] == "forbidden"
        stored = first.get("/v1/nodes/n1").json()
        assert (stored["region"], stored["seq"]) == ("eu", 2)


def test_a_node_another_replica_stored_elsewhere_is_not_claimed_as_new(
    settings: Settings, clock: FakeClock
) -> None:
    key = NodeKey.generate()
    with TestClient(_replica(settings, clock), headers=ADMIN) as first:
        created = first.post("/v1/tokens", json={"role": "agent", "region": "us"})
        agent = {"Authorization": f"Bearer {created.json()['token']}"}
        with TestClient(_replica(settings, clock)) as second:
            # Stored in "eu" through the first replica; unknown to the second one.
            assert first.put("/v1/nodes/n2/key", json={"public_key": key.public_key})
            answer = first.put("/v1/nodes/n2/snapshot", json=_signed("n2", "eu", 1, key))
            assert answer.status_code == 200, answer.text
            claimed = second.put(
                "/v1/nodes/n2/snapshot", json=_signed("n2", "us", 2, key), headers=agent
            )
            assert claimed.status_code == 403, claimed.text
        stored = first.get("/v1/nodes/n2").json()
        assert (stored["region"], stored["seq"]) == ("eu", 1)
