"""A region-scoped agent reports only nodes its region holds, as the database says.

The token check runs before the report, against the replica's memory: another
replica may have moved the node to another region (an admin's report) and this
one not heard of it yet, or the move may commit between the check and the write.
The report's own transaction checks the stored region again; so do a heartbeat's
and a first key registration's.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from placement.profiles import build_profile
from service import schema
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
            # Refused by where the database holds the node, which the path named.
            assert back.json()["error"]["detail"]["field"] == "path.name"
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
            assert claimed.json()["error"]["detail"]["field"] == "path.name"
        stored = first.get("/v1/nodes/n2").json()
        assert (stored["region"], stored["seq"]) == ("eu", 1)


def _heartbeat_at(state: ServiceState, name: str) -> Any:
    with state.engine.connect() as conn:
        query = sa.select(schema.nodes.c.heartbeat_at).where(schema.nodes.c.name == name)
        return conn.execute(query).scalar_one()


def test_a_node_moved_out_of_a_region_is_not_heartbeated_by_its_old_agent_on_another_replica(
    settings: Settings, clock: FakeClock
) -> None:
    key = NodeKey.generate()
    with TestClient(_replica(settings, clock), headers=ADMIN) as first:
        created = first.post("/v1/tokens", json={"role": "agent", "region": "us"})
        agent = {"Authorization": f"Bearer {created.json()['token']}"}
        assert first.put("/v1/nodes/n3/key", json={"public_key": key.public_key})
        answer = first.put("/v1/nodes/n3/snapshot", json=_signed("n3", "us", 1, key))
        assert answer.status_code == 200, answer.text
        with TestClient(_replica(settings, clock)) as second:
            behind: ServiceState = second.app.state.service  # type: ignore[attr-defined]
            moved = first.put("/v1/nodes/n3/snapshot", json=_signed("n3", "eu", 2, key))
            assert moved.status_code == 200, moved.text
            assert behind.cluster.node("n3").snapshot.region == "us"  # not heard of yet
            before = _heartbeat_at(behind, "n3")
            clock.advance(30)
            beat = second.post("/v1/nodes/n3/heartbeat", headers=agent)
            assert beat.status_code == 403, beat.text
            assert beat.json()["error"]["code"] == "forbidden"
            assert _heartbeat_at(behind, "n3") == before
            # The node's own region's heartbeat goes on as before.
            assert first.post("/v1/nodes/n3/heartbeat").status_code == 204


def test_a_node_another_replica_stored_elsewhere_has_no_first_key_claimed_for_it(
    settings: Settings, clock: FakeClock
) -> None:
    key = NodeKey.generate()
    with TestClient(_replica(settings, clock), headers=ADMIN) as first:
        created = first.post("/v1/tokens", json={"role": "agent", "region": "us"})
        agent = {"Authorization": f"Bearer {created.json()['token']}"}
        with TestClient(_replica(settings, clock)) as second:
            # Stored in "eu" through the first replica, by an admin, with no key yet;
            # unknown to the second one.
            snap = build_profile("hgx-h100", "n4", region="eu", seq=1)
            answer = first.put(
                "/v1/nodes/n4/snapshot", json={"snapshot": snap.model_dump(mode="json")}
            )
            assert answer.status_code == 200, answer.text
            claimed = second.put(
                "/v1/nodes/n4/key", json={"public_key": key.public_key}, headers=agent
            )
            assert claimed.status_code == 403, claimed.text
            assert claimed.json()["error"]["detail"]["field"] == "path.name"
            assert claimed.json()["error"]["code"] == "forbidden"
        assert first.get("/v1/nodes/n4/key").status_code == 404


def test_a_node_moved_out_of_a_region_has_no_first_key_claimed_by_its_old_agent(
    settings: Settings, clock: FakeClock
) -> None:
    key = NodeKey.generate()
    with TestClient(_replica(settings, clock), headers=ADMIN) as first:
        created = first.post("/v1/tokens", json={"role": "agent", "region": "us"})
        agent = {"Authorization": f"Bearer {created.json()['token']}"}
        snap = build_profile("hgx-h100", "n5", region="us", seq=1)
        answer = first.put("/v1/nodes/n5/snapshot", json={"snapshot": snap.model_dump(mode="json")})
        assert answer.status_code == 200, answer.text
        with TestClient(_replica(settings, clock)) as second:
            behind: ServiceState = second.app.state.service  # type: ignore[attr-defined]
            moved = snap.model_copy(update={"region": "eu", "seq": 2})
            answer = first.put(
                "/v1/nodes/n5/snapshot", json={"snapshot": moved.model_dump(mode="json")}
            )
            assert answer.status_code == 200, answer.text
            assert behind.cluster.node("n5").snapshot.region == "us"  # not heard of yet
            claimed = second.put(
                "/v1/nodes/n5/key", json={"public_key": key.public_key}, headers=agent
            )
            assert claimed.status_code == 403, claimed.text
            assert claimed.json()["error"]["detail"]["field"] == "path.name"
        assert first.get("/v1/nodes/n5/key").status_code == 404
