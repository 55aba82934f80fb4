"""The audit log over the API: what each change leaves, who asked, filters and paging.

Through the real token check: a scheduler token places, the admin token
administers, and the rows name them (their token ids, names and roles) and
the route each came through.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from placement.profiles import build_profile
from service import schema
from service.audit.refusals import RefusalGate
from service.state import ServiceState
from tests.service.audit.test_refusals import Ticks
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


def _state(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def _token(client: TestClient, role: str, name: str, **scope: Any) -> tuple[str, str]:
    made = client.post("/v1/tokens", json={"role": role, "name": name, **scope})
    assert made.status_code == 201, made.text
    return made.json()["id"], made.json()["token"]


def _as(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _audit(client: TestClient, **params: Any) -> list[dict[str, Any]]:
    answer = client.get("/v1/audit", params=params)
    assert answer.status_code == 200, answer.text
    entries: list[dict[str, Any]] = answer.json()["entries"]
    return entries


def test_a_placement_names_the_request_the_choice_and_who_asked(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    token_id, secret = _token(client, "scheduler", "slurmctld")
    placed = client.post("/v1/place", json={"gpus": 2, "job_id": "j1"}, headers=_as(secret))
    assert placed.status_code == 201, placed.text
    allocation = placed.json()
    [entry] = _audit(client, kind="allocation", action="placed")
    assert entry["actor"] == {"token_id": token_id, "name": "slurmctld", "role": "scheduler"}
    assert entry["route"] == "POST /v1/place"
    assert (entry["allocation_id"], entry["job_id"], entry["nodes"]) == (
        allocation["id"],
        "j1",
        ["h0"],
    )
    detail = entry["detail"]
    assert detail["state"] == "pending"
    assert detail["request"]["gpus"] == 2 and detail["request"]["job_id"] == "j1"
    [task] = detail["placement"]["tasks"]
    assert task["gpu_indices"] == allocation["tasks"][0]["gpu_indices"]
    assert task["gpu_uuids"] == allocation["tasks"][0]["gpu_uuids"]
    assert set(task["score"]) >= {"ring_gbps", "bandwidth", "fragmentation"}


def test_every_change_of_an_allocation_has_its_row(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    kept = client.post("/v1/place", json={"gpus": 2, "job_id": "kept"}).json()["id"]
    lapsing = client.post("/v1/place", json={"gpus": 2, "ttl_s": 30}).json()["id"]
    assert client.post(f"/v1/allocations/{kept}/extend", json={"ttl_s": 60}).status_code == 200
    assert client.post(f"/v1/allocations/{kept}/confirm").status_code == 200
    assert client.post(f"/v1/allocations/{kept}/confirm").status_code == 200  # no change
    assert client.post("/v1/jobs/kept/release").status_code == 200
    assert client.post(f"/v1/allocations/{kept}/release").status_code == 200  # ended before
    clock.advance(31)
    assert client.post(f"/v1/allocations/{lapsing}/confirm").status_code == 409  # expires it
    actions = [(e["action"], e["allocation_id"], e["route"]) for e in _audit(client)]
    assert actions[::-1] == [
        ("placed", kept, "POST /v1/place"),
        ("placed", lapsing, "POST /v1/place"),
        ("extended", kept, "POST /v1/allocations/{allocation_id}/extend"),
        ("confirmed", kept, "POST /v1/allocations/{allocation_id}/confirm"),
        ("released", kept, "POST /v1/jobs/{job_id}/release"),
        ("expired", lapsing, "POST /v1/allocations/{allocation_id}/confirm"),
    ]
    [released] = _audit(client, action="released")
    assert released["detail"]["state"] == "released" and released["job_id"] == "kept"
    held = client.get(f"/v1/allocations/{kept}").json()["tasks"][0]["gpu_indices"]
    assert released["detail"]["gpus"] == {"h0": held} and len(held) == 2


def test_the_sweep_expires_as_the_service(client: TestClient, clock: FakeClock) -> None:
    from service.allocations import api
    from service.app import SWEEP
    from service.audit.actor import acting

    add_nodes(client, ("hgx-h100", "h0"))
    lapsing = client.post("/v1/place", json={"gpus": 1, "ttl_s": 30}).json()["id"]
    clock.advance(31)
    with acting(SWEEP):  # as the background loop runs it
        assert api.sweep(_state(client)).ids == (lapsing,)
    [expired] = _audit(client, action="expired")
    assert expired["allocation_id"] == lapsing and expired["route"] == "sweep"
    assert expired["actor"] == {"token_id": None, "name": "topoplace service", "role": None}


def test_admin_actions_are_recorded_with_the_admin(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    agent_id, _ = _token(client, "agent", "h0's agent", nodes=["h0"])
    assert client.delete(f"/v1/tokens/{agent_id}").status_code == 204
    assert client.delete(f"/v1/tokens/{agent_id}").status_code == 204  # revoked before
    first, second = NodeKey.generate(), NodeKey.generate()
    assert client.put("/v1/nodes/h1/key", json={"public_key": first.public_key}).status_code == 200
    assert client.put("/v1/nodes/h1/key", json={"public_key": first.public_key}).status_code == 200
    replaced = client.put("/v1/nodes/h1/key?replace=true", json={"public_key": second.public_key})
    assert replaced.status_code == 200
    assert client.delete("/v1/nodes/h1/key").status_code == 204
    assert client.post("/v1/nodes/h0/cordon").status_code == 200
    cordoned = client.post("/v1/nodes/h0/cordon")  # cordoned before: nothing changes
    assert cordoned.status_code == 200 and cordoned.json()["state"] == "cordoned"
    assert client.post("/v1/nodes/h0/uncordon").status_code == 200
    assert client.post("/v1/nodes/h0/uncordon").status_code == 200  # uncordoned before
    assert client.delete("/v1/nodes/h0").status_code == 204
    entries = _audit(client, kind="admin")[::-1]
    assert [(e["action"], e["nodes"]) for e in entries] == [
        ("token_created", ["h0"]),
        ("token_revoked", []),
        ("key_registered", ["h1"]),
        ("key_replaced", ["h1"]),
        ("key_deleted", ["h1"]),
        ("node_cordoned", ["h0"]),
        ("node_uncordoned", ["h0"]),
        ("node_deleted", ["h0"]),
    ]
    assert all(e["actor"]["role"] == "admin" for e in entries)
    assert entries[0]["detail"] == {
        "token_id": agent_id,
        "role": "agent",
        "name": "h0's agent",
        "nodes": ["h0"],
        "region": None,
    }
    assert entries[3]["detail"]["public_key"] == second.public_key
    assert entries[5]["route"] == "POST /v1/nodes/{name}/cordon"


def test_a_refused_snapshot_is_recorded_though_nothing_changed(client: TestClient) -> None:
    key = NodeKey.generate()
    assert client.put("/v1/nodes/h0/key", json={"public_key": key.public_key}).status_code == 200
    _, agent = _token(client, "agent", "h0's agent", nodes=["h0"])
    body = build_profile("hgx-h100", "h0").model_copy(update={"seq": 7}).model_dump(mode="json")
    forged = NodeKey.generate().sign(body)
    url = "/v1/nodes/h0/snapshot"
    refused = client.put(url, json={"snapshot": body, "signature": forged}, headers=_as(agent))
    assert refused.json()["error"]["code"] == "bad_signature"
    taken = client.put(
        url, json={"snapshot": body, "signature": key.sign(body)}, headers=_as(agent)
    )
    assert taken.status_code == 200
    again = client.put(
        url, json={"snapshot": body, "signature": key.sign(body)}, headers=_as(agent)
    )
    assert again.json()["error"]["code"] == "replayed_snapshot"
    unkeyed = build_profile("hgx-h100", "h9").model_dump(mode="json")
    _, h9_agent = _token(client, "agent", "h9's agent", nodes=["h9"])
    no_key = client.put("/v1/nodes/h9/snapshot", json={"snapshot": unkeyed}, headers=_as(h9_agent))
    assert no_key.json()["error"]["code"] == "node_key_required"
    entries = _audit(client, kind="snapshot")[::-1]
    assert [(e["action"], e["nodes"]) for e in entries] == [
        ("bad_signature", ["h0"]),
        ("replayed_snapshot", ["h0"]),
        ("node_key_required", ["h9"]),
    ]
    assert entries[0]["detail"]["seq"] == 7 and entries[0]["detail"]["signed"] is True
    assert entries[1]["detail"]["detail"] == {"field": "snapshot.seq", "stored_seq": 7}
    assert entries[0]["actor"]["name"] == "h0's agent"
    assert entries[0]["route"] == "PUT /v1/nodes/{name}/snapshot"
    with _state(client).engine.connect() as conn:  # the refused snapshot of h9 left no node
        assert conn.execute(sa.select(schema.nodes.c.name)).scalars().all() == ["h0"]


def test_a_flood_of_refused_snapshots_writes_one_row_per_node_and_cause_a_window(
    client: TestClient,
) -> None:
    """An agent reporting again and again with a key that is not the node's (broken, or
    stolen) wrote a row per report: 1,000 reports, 1,000 rows. Each is still refused."""
    ticks = Ticks()
    _state(client).snapshot_refusal_gate = RefusalGate(60.0, 600, clock=ticks)
    key = NodeKey.generate()
    assert client.put("/v1/nodes/h0/key", json={"public_key": key.public_key}).status_code == 200
    _, agent = _token(client, "agent", "h0's agent", nodes=["h0", "h1"])
    body = build_profile("hgx-h100", "h0").model_copy(update={"seq": 7}).model_dump(mode="json")
    forged = {"snapshot": body, "signature": NodeKey.generate().sign(body)}
    for _ in range(1000):
        refused = client.put("/v1/nodes/h0/snapshot", json=forged, headers=_as(agent))
        assert refused.json()["error"]["code"] == "bad_signature"
    unkeyed = build_profile("hgx-h100", "h1").model_dump(mode="json")
    for _ in range(3):
        no_key = client.put("/v1/nodes/h1/snapshot", json={"snapshot": unkeyed}, headers=_as(agent))
        assert no_key.json()["error"]["code"] == "node_key_required"
    entries = _audit(client, kind="snapshot")[::-1]
    assert [(e["action"], e["nodes"]) for e in entries] == [
        ("bad_signature", ["h0"]),
        ("node_key_required", ["h1"]),
    ]
    assert entries[0]["detail"]["coalesced"] == 0
    ticks.now += 60  # a window later: the next refusal's row carries those folded into none
    client.put("/v1/nodes/h0/snapshot", json=forged, headers=_as(agent))
    newest = _audit(client, kind="snapshot")[0]
    assert (newest["action"], newest["detail"]["coalesced"]) == ("bad_signature", 999)
    metrics = client.get("/metrics").text
    assert 'topoplace_snapshot_refusals_total{reason="bad_signature"} 1001.0' in metrics


def test_a_gpu_uuid_another_node_holds_is_a_recorded_refusal(client: TestClient) -> None:
    [h0] = add_nodes(client, ("hgx-h100", "h0"))
    thief = build_profile("hgx-h100", "h1")
    thief = thief.model_copy(
        update={
            "gpus": [thief.gpus[0].model_copy(update={"uuid": h0.gpus[0].uuid}), *thief.gpus[1:]]
        }
    )
    answer = client.put("/v1/nodes/h1/snapshot", json={"snapshot": thief.model_dump(mode="json")})
    assert answer.status_code == 409
    [entry] = _audit(client, kind="snapshot", node="h1")
    assert entry["action"] == answer.json()["error"]["code"]
    assert h0.gpus[0].uuid in str(entry["detail"])


def test_filters_and_cursor_paging(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"), ("hgx-h100", "h1"))
    scheduler_id, secret = _token(client, "scheduler", "k8s")
    ids = []
    for i in range(5):
        node = f"h{i % 2}"
        body = {"gpus": 1, "job_id": f"job-{i}", "nodes": [node]}
        ids.append(client.post("/v1/place", json=body, headers=_as(secret)).json()["id"])
        clock.advance(10)
    assert [e["allocation_id"] for e in _audit(client, actor=scheduler_id)] == ids[::-1]
    assert [e["job_id"] for e in _audit(client, node="h1")] == ["job-3", "job-1"]
    assert [e["job_id"] for e in _audit(client, job_id="job-2")] == ["job-2"]
    assert [e["job_id"] for e in _audit(client, allocation_id=ids[4])] == ["job-4"]
    [first] = _audit(client, action="placed", job_id="job-0")
    at = first["at"]
    later = _audit(client, action="placed", since=at)
    assert len(later) == 5
    assert _audit(client, action="placed", until=at) == []
    # Pages of two, newest first, until the cursor runs out: each row once.
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"kind": "allocation", "limit": 2}
        if cursor is not None:
            params["cursor"] = cursor
        page = client.get("/v1/audit", params=params).json()
        seen += [e["allocation_id"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    # A node name with LIKE's wildcards is matched as written, not as a pattern.
    assert _audit(client, node="h_") == [] and _audit(client, node="%") == []


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": "x"}, "cursor"),
        ({"cursor": "0"}, "cursor"),
        # Past a 64-bit row id, and digits int() or the database cannot take: each was a 500.
        ({"cursor": "9223372036854775808"}, "cursor"),
        ({"cursor": "9999999999999999999"}, "cursor"),
        ({"cursor": "\u00b2"}, "cursor"),
        ({"cursor": "\u0661\u0662"}, "cursor"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"kind": "everything"}, "kind"),
        ({"since": "2026-12-02T10:00:00Z", "until": "2026-12-02T09:00:00Z"}, "until"),
        ({"since": "yesterday"}, "since"),
    ],
)
def test_bad_queries_are_refused_with_the_field(
    client: TestClient, params: dict[str, Any], field: str
) -> None:
    answer = client.get("/v1/audit", params=params)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and field in str(error["detail"])


@pytest.mark.parametrize("role", ["viewer", "scheduler", "agent"])
def test_only_an_admin_reads_the_audit_log(client: TestClient, role: str) -> None:
    scope = {"nodes": ["h0"]} if role == "agent" else {}
    _, secret = _token(client, role, role, **scope)
    assert client.get("/v1/audit", headers=_as(secret)).status_code == 403
    client.headers.pop("Authorization")
    assert client.get("/v1/audit").status_code == 401


def test_times_without_a_zone_are_utc(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    client.post("/v1/place", json={"gpus": 1})
    now = clock()
    naive = (now - timedelta(seconds=1)).replace(tzinfo=None).isoformat()
    assert len(_audit(client, action="placed", since=naive)) == 1
    assert _audit(client, action="placed", until=naive) == []
