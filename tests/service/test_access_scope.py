"""An agent token acts only for the nodes (or region) in its scope; tokens are revocable.

REST and gRPC both; the admin API shows a token's secret once and never again.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.grpc.conftest import Running, reason, snapshot_request, start

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def new_token(client: TestClient, **body: Any) -> str:
    created = client.post("/v1/tokens", json=body, headers=ADMIN)
    assert created.status_code == 201, created.text
    token: str = created.json()["token"]
    return token


def snapshot_body(name: str, region: str = "default", seq: int = 1) -> dict[str, Any]:
    snap = build_profile("hgx-h100", name).model_copy(update={"region": region, "seq": seq})
    return {"snapshot": snap.model_dump(mode="json")}


def public_key() -> str:
    raw = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return base64.b64encode(raw).decode()


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 'scope.sqlite3'}"))
    with TestClient(create_app(settings, background=False)) as test_client:
        yield test_client


def test_an_agent_token_acts_only_for_its_own_node(client: TestClient) -> None:
    assert client.put("/v1/nodes/node-b/snapshot", json=snapshot_body("node-b"), headers=ADMIN)
    before = client.get("/v1/nodes/node-b", headers=ADMIN).json()
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))

    assert client.put("/v1/nodes/node-a/key", json={"public_key": public_key()}, headers=agent)
    ok = client.put("/v1/nodes/node-a/snapshot", json=snapshot_body("node-a"), headers=agent)
    assert ok.status_code == 200, ok.text
    assert client.post("/v1/nodes/node-a/heartbeat", headers=agent).status_code == 204

    refused = [
        client.put("/v1/nodes/node-b/snapshot", json=snapshot_body("node-b", seq=2), headers=agent),
        client.post("/v1/nodes/node-b/heartbeat", headers=agent),
        client.put("/v1/nodes/node-b/key", json={"public_key": public_key()}, headers=agent),
        client.delete("/v1/nodes/node-a/key", headers=agent),  # re-keying is an admin's
    ]
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "forbidden"
    assert "node-b" in refused[0].json()["error"]["message"]
    # Nothing changed on node-b: no snapshot, no heartbeat, no key.
    assert client.get("/v1/nodes/node-b", headers=ADMIN).json() == before
    assert client.get("/v1/nodes/node-b/key", headers=ADMIN).status_code == 404
    # An agent reads nothing and places nothing.
    assert client.get("/v1/nodes", headers=agent).status_code == 403
    assert client.post("/v1/place", json={"gpus": 1}, headers=agent).status_code == 403


def test_a_region_token_acts_for_nodes_of_its_region_only(client: TestClient) -> None:
    elsewhere = client.put(
        "/v1/nodes/far-1/snapshot", json=snapshot_body("far-1", region="eu"), headers=ADMIN
    )
    assert elsewhere.status_code == 200
    agent = bearer(new_token(client, role="agent", region="us"))

    new = client.put("/v1/nodes/near-1/snapshot", json=snapshot_body("near-1", "us"), headers=agent)
    assert new.status_code == 200, new.text
    assert client.post("/v1/nodes/near-1/heartbeat", headers=agent).status_code == 204
    # A key may come before the first snapshot.
    key = client.put("/v1/nodes/near-2/key", json={"public_key": public_key()}, headers=agent)
    assert key.status_code == 200, key.text

    for name, region in (("far-2", "eu"), ("far-1", "us"), ("near-1", "eu")):
        # a new node elsewhere; a node of another region claimed into ours; ours moved out
        answer = client.put(
            f"/v1/nodes/{name}/snapshot", json=snapshot_body(name, region, seq=5), headers=agent
        )
        assert answer.status_code == 403, (name, region, answer.text)
    assert client.post("/v1/nodes/far-1/heartbeat", headers=agent).status_code == 403
    assert client.get("/v1/nodes/far-1", headers=ADMIN).json()["region"] == "eu"


def test_revocation_takes_effect_at_once_here(client: TestClient) -> None:
    created = client.post("/v1/tokens", json={"role": "viewer"}, headers=ADMIN).json()
    viewer = bearer(created["token"])
    assert client.get("/v1/nodes", headers=viewer).status_code == 200  # now cached
    assert client.delete(f"/v1/tokens/{created['id']}", headers=ADMIN).status_code == 204
    refused = client.get("/v1/nodes", headers=viewer)
    assert refused.status_code == 401
    assert "revoked" in refused.json()["error"]["message"]
    assert client.delete("/v1/tokens/nope", headers=ADMIN).status_code == 404


def test_the_secret_is_shown_once_and_only_its_hash_is_kept(client: TestClient) -> None:
    created = client.post(
        "/v1/tokens", json={"role": "agent", "nodes": ["n1"], "name": "rack 7"}, headers=ADMIN
    ).json()
    secret = created["token"]
    assert secret.startswith(f"tpp_{created['id']}_")
    listed = client.get("/v1/tokens", headers=ADMIN).json()["tokens"]
    assert [t["id"] for t in listed] == [created["id"]]
    assert "token" not in listed[0] and secret not in str(listed)
    assert listed[0]["nodes"] == ["n1"] and listed[0]["name"] == "rack 7"
    stored = client.app.state.service.engine  # type: ignore[attr-defined]
    with stored.connect() as conn:
        rows = conn.exec_driver_sql("SELECT secret_hash FROM api_tokens").scalars().all()
    assert rows and all(r.startswith("scrypt$") and secret.split("_")[2] not in r for r in rows)


@pytest.mark.parametrize(
    "body",
    [
        {"role": "agent"},  # an agent needs a scope
        {"role": "viewer", "nodes": ["n1"]},  # only agents have one
        {"role": "agent", "nodes": ["Not A Node"]},
        {"role": "root"},
    ],
)
def test_a_token_request_that_does_not_fit_is_refused(
    client: TestClient, body: dict[str, Any]
) -> None:
    answer = client.post("/v1/tokens", json=body, headers=ADMIN)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "invalid_request"


def test_a_wrong_secret_for_a_real_id_is_refused(client: TestClient) -> None:
    created = client.post("/v1/tokens", json={"role": "viewer"}, headers=ADMIN).json()
    forged = bearer(f"tpp_{created['id']}_not-the-secret")
    assert client.get("/v1/nodes", headers=forged).status_code == 401
    assert client.get("/v1/nodes", headers=forged).status_code == 401  # from the refusal cache


@pytest.fixture
def grpc_running(tmp_path: Path) -> Iterator[Running]:
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 'grpc-scope.sqlite3'}"))
    yield from start(settings)


def test_grpc_agent_scope(grpc_running: Running) -> None:
    token = new_token(grpc_running.rest, role="agent", nodes=["node-a"])
    metadata = (("authorization", f"Bearer {token}"),)
    accepted = grpc_running.stub.ReportSnapshot(
        snapshot_request("hgx-h100", "node-a"), metadata=metadata
    )
    assert accepted.node == "node-a"
    for call in (
        lambda: grpc_running.stub.ReportSnapshot(
            snapshot_request("hgx-h100", "node-b"), metadata=metadata
        ),
        lambda: grpc_running.stub.Heartbeat(pb.HeartbeatRequest(node="node-b"), metadata=metadata),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert reason(caught.value) == "forbidden"
    assert grpc_running.rest.get("/v1/nodes/node-b", headers=ADMIN).status_code == 404


def test_verification_is_cached(client: TestClient) -> None:
    viewer = bearer(new_token(client, role="viewer"))
    client.get("/v1/nodes", headers=viewer)
    started = time.perf_counter()
    for _ in range(50):
        assert client.get("/v1/nodes", headers=viewer).status_code == 200
    per_request = (time.perf_counter() - started) / 50
    # One scrypt is ~40 ms; a cached token costs a hash and a lookup.
    assert per_request < 0.02, per_request
