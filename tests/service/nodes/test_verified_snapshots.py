"""Signed snapshots: refused unless signed by the node's registered key, and replays refused.

Every refusal is checked to change nothing: the node row (snapshot, seq,
reported_at, heartbeat_at), its history and the allocations on it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from placement import NodeSnapshot
from placement.profiles import build_profile
from service import schema
from service.access import Role
from service.admin_actions import Caller
from service.auth import Forbidden, Principal
from service.errors import NodeKeyRequired
from service.grpc.gen import topoplace_pb2 as pb
from service.nodes import service
from service.nodes.schemas import NodeKeyRegistration, SnapshotReport
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.grpc.conftest import Running, reason, start

NAME = "h100-a"
# An agent token whose scope holds the nodes below: it may report them, not administer.
NOT_ADMIN = Caller(Principal("t-agent", Role.AGENT, frozenset({"no-key", "new-node"})))
ADMIN = Caller(Principal("t-admin", Role.ADMIN))


def _body(snap: NodeSnapshot, seq: int) -> dict[str, Any]:
    return snap.model_copy(update={"seq": seq}).model_dump(mode="json")


def _put(client: TestClient, body: dict[str, Any], signature: str | None) -> Any:
    payload: dict[str, Any] = {"snapshot": body}
    if signature is not None:
        payload["signature"] = signature
    return client.put(f"/v1/nodes/{body['name']}/snapshot", json=payload)


def _register(client: TestClient, name: str, key: NodeKey) -> None:
    response = client.put(f"/v1/nodes/{name}/key", json={"public_key": key.public_key})
    assert response.status_code == 200, response.text


def _state(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def _everything(client: TestClient) -> dict[str, Any]:
    """What a refused snapshot must leave as it was."""
    with _state(client).engine.connect() as conn:
        nodes = [dict(r) for r in conn.execute(sa.select(schema.nodes)).mappings()]
        history = conn.execute(sa.select(sa.func.count()).select_from(schema.node_snapshots))
        allocations = conn.execute(
            sa.select(schema.allocations.c.id, schema.allocations.c.state)
        ).all()
        holds = conn.execute(sa.select(schema.gpu_holds.c.device)).all()
    return {
        "nodes": nodes,
        "history": history.scalar_one(),
        "allocations": sorted(map(tuple, allocations)),
        "holds": sorted(map(tuple, holds)),
        "heartbeats": dict(_state(client).heartbeats),
    }


@pytest.fixture
def signed(client: TestClient, clock: FakeClock) -> Iterator[tuple[NodeKey, NodeSnapshot]]:
    """A keyed node with a signed snapshot (seq 10) stored and a job placed on all its GPUs."""
    key = NodeKey.generate()
    _register(client, NAME, key)
    snap = build_profile("hgx-h100", NAME)
    body = _body(snap, 10)
    response = _put(client, body, key.sign(body))
    assert response.status_code == 200, response.text
    placed = client.post("/v1/place", json={"gpus": 8, "job_id": "running"})
    assert placed.status_code == 201, placed.text
    clock.advance(30)  # a refused report must not move the heartbeat to this time
    yield key, snap


def _forged(snap: NodeSnapshot) -> NodeSnapshot:
    """The forgery of the threat model: new GPU UUIDs, which would degrade the running job."""
    gpus = [g.model_copy(update={"uuid": f"GPU-forged-{g.index}"}) for g in snap.gpus]
    return snap.model_copy(update={"gpus": gpus})


def _other_node_signature(body: dict[str, Any]) -> str:
    return NodeKey.generate().sign(body)


REFUSED_SIGNATURES = {
    "unsigned": lambda key, body: None,
    "wrong": lambda key, body: key.sign({**body, "region": "elsewhere"}),
    "not base64": lambda key, body: "not*base64!" * 8,
    "truncated": lambda key, body: base64.b64encode(b"\0" * 32).decode(),
    "another node's": lambda key, body: _other_node_signature(body),
}


@pytest.mark.parametrize("kind", sorted(REFUSED_SIGNATURES))
def test_a_badly_signed_snapshot_is_refused_and_changes_nothing(
    client: TestClient, signed: tuple[NodeKey, NodeSnapshot], kind: str
) -> None:
    key, snap = signed
    before = _everything(client)
    body = _body(_forged(snap), 11)
    response = _put(client, body, REFUSED_SIGNATURES[kind](key, body))
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_signature" and error["detail"]["field"] == "signature"
    assert _everything(client) == before
    assert client.get("/v1/allocations").json()["allocations"][0]["state"] == "pending"


def test_a_resent_snapshot_is_a_replay_and_keeps_no_dead_node_alive(
    client: TestClient, signed: tuple[NodeKey, NodeSnapshot], clock: FakeClock
) -> None:
    key, snap = signed
    before = _everything(client)
    for seq in (10, 9, 1):  # the stored one sent again, and older ones
        body = _body(snap, seq)
        response = _put(client, body, key.sign(body))
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "replayed_snapshot"
        assert error["detail"] == {"field": "snapshot.seq", "stored_seq": 10}
    assert _everything(client) == before
    clock.advance(60)  # past heartbeat_ttl_s since the last accepted report
    assert client.get(f"/v1/nodes/{NAME}").json()["state"] == "stale"


def test_a_deleted_keyed_node_is_not_revived_by_its_last_snapshot_sent_again(
    client: TestClient, signed: tuple[NodeKey, NodeSnapshot]
) -> None:
    key, snap = signed
    job = client.get("/v1/allocations", params={"job_id": "running"}).json()["allocations"][0]
    assert client.post(f"/v1/allocations/{job['id']}/release").status_code == 200
    assert client.delete(f"/v1/nodes/{NAME}").status_code == 204  # a dead node, removed
    # Its key stays registered, so a captured signed snapshot still verifies; its seq is
    # the one the deleted row held, and it is refused as a replay all the same.
    for seq in (10, 9):
        body = _body(snap, seq)
        response = _put(client, body, key.sign(body))
        assert response.status_code == 409, response.text
        error = response.json()["error"]
        assert error["code"] == "replayed_snapshot"
        assert error["detail"] == {"field": "snapshot.seq", "stored_seq": 10}
    assert client.get(f"/v1/nodes/{NAME}").status_code == 404
    # The node itself, signing a new seq, is taken back.
    body = _body(snap, 11)
    response = _put(client, body, key.sign(body))
    assert response.status_code == 200, response.text
    assert client.get(f"/v1/nodes/{NAME}").json()["state"] == "ready"


def test_a_newer_signed_snapshot_is_taken(
    client: TestClient, signed: tuple[NodeKey, NodeSnapshot], clock: FakeClock
) -> None:
    key, snap = signed
    body = _body(snap, 11)
    response = _put(client, body, key.sign(body))
    assert response.status_code == 200, response.text
    assert client.get(f"/v1/nodes/{NAME}").json()["heartbeat_at"].startswith("2026-06-01T12:00:30")


def test_an_unkeyed_node_is_refused_from_a_caller_who_may_not_register_its_key(
    settings: Settings, client: TestClient
) -> None:
    snap = build_profile("hgx-h100", "no-key")
    with pytest.raises(NodeKeyRequired):
        service.report_snapshot(_state(client), "no-key", SnapshotReport(snapshot=snap), NOT_ADMIN)
    assert client.get("/v1/nodes/no-key").status_code == 404
    # An admin may (it could register any key it likes first).
    service.report_snapshot(_state(client), "no-key", SnapshotReport(snapshot=snap), ADMIN)
    assert client.get("/v1/nodes/no-key").status_code == 200


def test_a_first_key_is_an_admin_action_unless_trust_on_first_use(client: TestClient) -> None:
    state = _state(client)
    key = NodeKeyRegistration(public_key=NodeKey.generate().public_key)
    with pytest.raises(Forbidden, match="admin action"):
        service.register_key(state, "new-node", key, NOT_ADMIN)
    assert client.get("/v1/nodes/new-node/key").status_code == 404
    trusting = state.settings.model_copy(update={"trust_on_first_use": True})
    state.settings = trusting
    assert service.register_key(state, "new-node", key, NOT_ADMIN).public_key == key.public_key
    # The same key again is fine; another one, or a replacement, is not.
    service.register_key(state, "new-node", key, NOT_ADMIN)
    other = NodeKeyRegistration(public_key=NodeKey.generate().public_key)
    with pytest.raises(Forbidden, match="admin action"):
        service.register_key(state, "new-node", other, NOT_ADMIN, replace=True)
    with pytest.raises(Forbidden, match="admin action"):
        service.delete_key(state, "new-node", NOT_ADMIN)
    assert client.get("/v1/nodes/new-node/key").json()["public_key"] == key.public_key


def test_an_admin_rotates_a_node_key_over_rest(
    client: TestClient, signed: tuple[NodeKey, NodeSnapshot]
) -> None:
    old, snap = signed
    new = NodeKey.generate()
    refused = client.put(f"/v1/nodes/{NAME}/key", json={"public_key": new.public_key})
    assert refused.status_code == 409 and "replace=true" in refused.json()["error"]["message"]
    rotated = client.put(
        f"/v1/nodes/{NAME}/key", params={"replace": "true"}, json={"public_key": new.public_key}
    )
    assert rotated.status_code == 200 and rotated.json()["public_key"] == new.public_key
    body = _body(snap, 11)
    assert _put(client, body, old.sign(body)).json()["error"]["code"] == "bad_signature"
    assert _put(client, body, new.sign(body)).status_code == 200


@pytest.fixture
def running(settings: Settings, clock: FakeClock) -> Iterator[Running]:
    yield from start(settings, clock)


def test_grpc_refuses_forged_and_replayed_snapshots(running: Running) -> None:
    key = NodeKey.generate()
    _register(running.rest, NAME, key)
    snap = build_profile("hgx-h100", NAME)
    body = _body(snap, 5)
    good = key.sign(body)
    request = pb.ReportSnapshotRequest(
        node=NAME, snapshot_json=snap.model_copy(update={"seq": 5}).model_dump_json()
    )
    for signature, code, why in (
        (None, grpc.StatusCode.PERMISSION_DENIED, "bad_signature"),
        (_other_node_signature(body), grpc.StatusCode.PERMISSION_DENIED, "bad_signature"),
    ):
        sent = pb.ReportSnapshotRequest()
        sent.CopyFrom(request)
        if signature is not None:
            sent.signature = signature
        with pytest.raises(grpc.RpcError) as refused:
            running.stub.ReportSnapshot(sent)
        assert refused.value.code() is code and reason(refused.value) == why
    request.signature = good
    assert running.stub.ReportSnapshot(request).seq == 5
    with pytest.raises(grpc.RpcError) as replayed:
        running.stub.ReportSnapshot(request)
    assert replayed.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert reason(replayed.value) == "replayed_snapshot"
