"""An agent token acts only for the nodes (or region) in its scope; tokens are revocable.

REST and gRPC both; the admin API shows a token's secret once and never again. The
agents here register their node's first key themselves, so the service trusts on
first use (tests/service/nodes/test_verified_snapshots.py covers it off), and sign
every snapshot.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from placement.profiles import build_profile
from service.app import create_app
from service.grpc.gen import topoplace_pb2 as pb
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.grpc.conftest import Running, details, reason, snapshot_request, start

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def new_token(client: TestClient, **body: Any) -> str:
    created = client.post("/v1/tokens", json=body, headers=ADMIN)
    assert created.status_code == 201, created.text
    token: str = created.json()["token"]
    return token


def snapshot_body(
    name: str, region: str = "default", seq: int = 1, key: NodeKey | None = None
) -> dict[str, Any]:
    """A snapshot report of ``name``, signed by ``key`` when given."""
    snap = build_profile("hgx-h100", name).model_copy(update={"region": region, "seq": seq})
    body: dict[str, Any] = {"snapshot": snap.model_dump(mode="json")}
    if key is not None:
        body["signature"] = key.sign(body["snapshot"])
    return body


def public_key() -> str:
    return NodeKey.generate().public_key


def trusting(path: Path) -> Settings:
    return secured(Settings(database_url=f"sqlite:///{path}", trust_on_first_use=True))


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(trusting(tmp_path / "scope.sqlite3"), background=False)) as c:
        yield c


def test_an_agent_token_acts_only_for_its_own_node(client: TestClient) -> None:
    assert client.put("/v1/nodes/node-b/snapshot", json=snapshot_body("node-b"), headers=ADMIN)
    before = client.get("/v1/nodes/node-b", headers=ADMIN).json()
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))
    key = NodeKey.generate()

    registered = client.put(
        "/v1/nodes/node-a/key", json={"public_key": key.public_key}, headers=agent
    )
    assert registered.status_code == 200, registered.text
    ok = client.put(
        "/v1/nodes/node-a/snapshot", json=snapshot_body("node-a", key=key), headers=agent
    )
    assert ok.status_code == 200, ok.text
    assert client.post("/v1/nodes/node-a/heartbeat", headers=agent).status_code == 204

    refused = [
        client.put(
            "/v1/nodes/node-b/snapshot", json=snapshot_body("node-b", seq=2, key=key), headers=agent
        ),
        client.post("/v1/nodes/node-b/heartbeat", headers=agent),
        client.put("/v1/nodes/node-b/key", json={"public_key": public_key()}, headers=agent),
        client.delete("/v1/nodes/node-a/key", headers=agent),  # re-keying is an admin's
        client.put(
            "/v1/nodes/node-a/key",
            params={"replace": "true"},
            json={"public_key": public_key()},
            headers=agent,
        ),
    ]
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"]["code"] == "forbidden"
    assert "node-b" in refused[0].json()["error"]["message"]
    assert "needs the admin role" in refused[-1].json()["error"]["message"]
    # Nothing changed on node-b: no snapshot, no heartbeat, no key; node-a kept its key.
    assert client.get("/v1/nodes/node-b", headers=ADMIN).json() == before
    assert client.get("/v1/nodes/node-b/key", headers=ADMIN).status_code == 404
    stored = client.get("/v1/nodes/node-a/key", headers=ADMIN).json()["public_key"]
    assert stored == key.public_key
    # An agent reads nothing and places nothing.
    assert client.get("/v1/nodes", headers=agent).status_code == 403
    assert client.post("/v1/place", json={"gpus": 1}, headers=agent).status_code == 403


def test_a_region_token_acts_for_nodes_of_its_region_only(client: TestClient) -> None:
    elsewhere = client.put(
        "/v1/nodes/far-1/snapshot", json=snapshot_body("far-1", region="eu"), headers=ADMIN
    )
    assert elsewhere.status_code == 200
    agent = bearer(new_token(client, role="agent", region="us"))
    key = NodeKey.generate()

    first = client.put("/v1/nodes/near-1/key", json={"public_key": key.public_key}, headers=agent)
    assert first.status_code == 200, first.text
    new = client.put(
        "/v1/nodes/near-1/snapshot", json=snapshot_body("near-1", "us", key=key), headers=agent
    )
    assert new.status_code == 200, new.text
    assert client.post("/v1/nodes/near-1/heartbeat", headers=agent).status_code == 204
    # A key may come before the first snapshot.
    second = client.put("/v1/nodes/near-2/key", json={"public_key": public_key()}, headers=agent)
    assert second.status_code == 200, second.text

    for name, region in (("far-2", "eu"), ("far-1", "us"), ("near-1", "eu")):
        # a new node elsewhere; a node of another region claimed into ours; ours moved out
        answer = client.put(
            f"/v1/nodes/{name}/snapshot",
            json=snapshot_body(name, region, seq=5, key=key),
            headers=agent,
        )
        assert answer.status_code == 403, (name, region, answer.text)
        assert answer.json()["error"]["code"] == "forbidden"
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
    # The random part may itself hold "_" (URL-safe base64): split off the prefix only, or
    # a one-letter fragment of it can turn up in the hash by chance.
    random_part = secret.split("_", 2)[2]
    assert rows and all(r.startswith("scrypt$") and random_part not in r for r in rows)


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
    yield from start(trusting(tmp_path / "grpc-scope.sqlite3"))


def test_grpc_agent_scope(grpc_running: Running) -> None:
    token = new_token(grpc_running.rest, role="agent", nodes=["node-a"])
    metadata = (("authorization", f"Bearer {token}"),)
    key = NodeKey.generate()
    registered = grpc_running.rest.put(
        "/v1/nodes/node-a/key", json={"public_key": key.public_key}, headers=bearer(token)
    )
    assert registered.status_code == 200, registered.text
    unsigned = snapshot_request("hgx-h100", "node-a")
    with pytest.raises(grpc.RpcError) as refused:
        grpc_running.stub.ReportSnapshot(unsigned, metadata=metadata)
    assert reason(refused.value) == "bad_signature"
    signed = snapshot_request("hgx-h100", "node-a")
    signed.signature = key.sign(snapshot_body("node-a")["snapshot"])
    accepted = grpc_running.stub.ReportSnapshot(signed, metadata=metadata)
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


def test_verification_is_cached(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """One scrypt is about 40 ms: a token verified once is not hashed again. Counted, not
    timed (a slow machine's requests alone can take what the hash would)."""
    viewer = bearer(new_token(client, role="viewer"))
    client.get("/v1/nodes", headers=viewer)
    scrypt, hashed = hashlib.scrypt, []

    def counted(*args: Any, **kwargs: Any) -> bytes:
        hashed.append(1)
        return scrypt(*args, **kwargs)

    monkeypatch.setattr(hashlib, "scrypt", counted)
    for _ in range(50):
        assert client.get("/v1/nodes", headers=viewer).status_code == 200
    assert hashed == []
    # The count sees the hashing it is there for: another token, made and used.
    assert client.get("/v1/nodes", headers=bearer(new_token(client, role="viewer"))).is_success
    assert hashed != []


def _refused_field(answer: Any) -> str:
    assert answer.status_code == 403, answer.text
    assert answer.json()["error"]["code"] == "forbidden"
    field: str = answer.json()["error"]["detail"]["field"]
    return field


def test_a_scope_refusal_names_the_path_when_the_path_named_the_node(client: TestClient) -> None:
    """Before, no field was named: a client could not tell the path's node from the
    snapshot's region."""
    assert client.put("/v1/nodes/node-b/snapshot", json=snapshot_body("node-b"), headers=ADMIN)
    agent = bearer(new_token(client, role="agent", nodes=["node-a"]))
    devices = {"resource": "nvidia.com/gpu", "pods": []}
    for answer in (
        client.put("/v1/nodes/node-b/snapshot", json=snapshot_body("node-b"), headers=agent),
        client.post("/v1/nodes/node-b/heartbeat", headers=agent),
        client.put("/v1/nodes/node-b/key", json={"public_key": public_key()}, headers=agent),
        client.post("/v1/nodes/node-b/k8s/devices", json=devices, headers=agent),
        client.get("/v1/nodes/node-b/k8s/reservations", headers=agent),
    ):
        assert _refused_field(answer) == "path.name"
        assert answer.json()["error"]["detail"]["node"] == "node-b"


def test_a_region_agents_refusal_names_the_snapshots_region_when_that_was_out_of_scope(
    client: TestClient,
) -> None:
    for name, region in (("far-1", "eu"), ("near-1", "us")):
        stored = client.put(
            f"/v1/nodes/{name}/snapshot", json=snapshot_body(name, region), headers=ADMIN
        )
        assert stored.status_code == 200, stored.text
    agent = bearer(new_token(client, role="agent", region="us"))
    cases = {
        ("far-2", "eu"): "snapshot.region",  # a new node, claimed into another region
        ("near-1", "eu"): "snapshot.region",  # ours, claimed out of the region
        ("far-1", "us"): "path.name",  # another region's node, claimed into ours
    }
    for (name, region), field in cases.items():
        answer = client.put(
            f"/v1/nodes/{name}/snapshot", json=snapshot_body(name, region, seq=5), headers=agent
        )
        assert _refused_field(answer) == field, (name, region)
    assert _refused_field(client.post("/v1/nodes/far-1/heartbeat", headers=agent)) == "path.name"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "agent"}, "nodes"),
        ({"role": "viewer", "nodes": ["n1"]}, "nodes"),
        ({"role": "viewer", "region": "us"}, "region"),
        ({"role": "region"}, "region"),
        ({"role": "region", "region": "us", "nodes": ["n1"]}, "nodes"),
    ],
)
def test_a_token_whose_scope_does_not_fit_its_role_names_the_field(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    """Before, every such refusal named ``nodes``, a region's too."""
    answer = client.post("/v1/tokens", json=body, headers=ADMIN)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["detail"]["field"] == field


def test_grpc_scope_refusals_name_the_request_field(grpc_running: Running) -> None:
    rest = grpc_running.rest
    stored = rest.put(
        "/v1/nodes/far-1/snapshot", json=snapshot_body("far-1", region="eu"), headers=ADMIN
    )
    assert stored.status_code == 200, stored.text
    scoped = (("authorization", f"Bearer {new_token(rest, role='agent', nodes=['node-a'])}"),)
    regional = (("authorization", f"Bearer {new_token(rest, role='agent', region='us')}"),)
    far_2 = snapshot_request("hgx-h100", "far-2")  # region "default": not ours
    stub = grpc_running.stub
    cases: list[tuple[Any, str]] = [
        (lambda: stub.ReportSnapshot(far_2, metadata=scoped), "node"),
        (lambda: stub.Heartbeat(pb.HeartbeatRequest(node="far-1"), metadata=scoped), "node"),
        (lambda: stub.ReportSnapshot(far_2, metadata=regional), "snapshot_json.region"),
        (lambda: stub.Heartbeat(pb.HeartbeatRequest(node="far-1"), metadata=regional), "node"),
    ]
    for call, field in cases:
        with pytest.raises(grpc.RpcError) as caught:
            call()
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert reason(caught.value) == "forbidden"
        violations = details(caught.value)["BadRequest"].field_violations  # type: ignore[attr-defined]
        assert [v.field for v in violations] == [field]
