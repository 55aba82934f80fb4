"""Admin actions against the role table, and what trust on first use lets an agent do.

Through real tokens (an admin's and an agent's scoped to one node), over REST and
gRPC: with trust on first use off an agent registers no key and reports nothing
until an admin registers its key; with it on the agent registers its node's
first key and then signs. Replacing or deleting a key stays an admin's either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from placement.profiles import build_profile
from service.access import Role
from service.admin_actions import INTERNAL, Caller, is_admin, require_admin
from service.app import create_app
from service.auth import INSECURE, Forbidden, Principal
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.grpc.conftest import Running, reason, snapshot_request, start

NODE = "node-a"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def agent_token(client: TestClient) -> dict[str, str]:
    created = client.post("/v1/tokens", json={"role": "agent", "nodes": [NODE]}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return bearer(created.json()["token"])


def report(key: NodeKey | None, seq: int = 1) -> dict[str, Any]:
    snapshot = build_profile("hgx-h100", NODE).model_copy(update={"seq": seq})
    body: dict[str, Any] = {"snapshot": snapshot.model_dump(mode="json")}
    if key is not None:
        body["signature"] = key.sign(body["snapshot"])
    return body


def app_client(path: Path, *, trust_on_first_use: bool) -> TestClient:
    settings = Settings(database_url=f"sqlite:///{path}", trust_on_first_use=trust_on_first_use)
    return TestClient(create_app(secured(settings), background=False))


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[TestClient]:
    with app_client(tmp_path / "strict.sqlite3", trust_on_first_use=False) as client:
        yield client


@pytest.fixture
def trusting(tmp_path: Path) -> Iterator[TestClient]:
    with app_client(tmp_path / "trusting.sqlite3", trust_on_first_use=True) as client:
        yield client


@pytest.mark.parametrize("role", list(Role))
def test_only_the_admin_role_performs_admin_actions(role: Role) -> None:
    caller = Caller(Principal("t", role, frozenset({NODE}) if role is Role.AGENT else frozenset()))
    if role is Role.ADMIN:
        require_admin(caller, "replacing a node's key")
        assert is_admin(caller)
        return
    with pytest.raises(Forbidden, match="replacing a node's key is an admin action") as refused:
        require_admin(caller, "replacing a node's key")
    assert refused.value.detail == {"needed": ["admin"]}
    assert not is_admin(caller)


def test_the_process_itself_and_insecure_dev_callers_are_admins() -> None:
    assert is_admin(INTERNAL)
    assert is_admin(Caller(INSECURE))


def test_without_trust_on_first_use_an_agent_waits_for_an_admin_to_register_its_key(
    strict: TestClient,
) -> None:
    agent = agent_token(strict)
    key = NodeKey.generate()
    first = strict.put(f"/v1/nodes/{NODE}/key", json={"public_key": key.public_key}, headers=agent)
    assert first.status_code == 403, first.text
    assert first.json()["error"]["code"] == "forbidden"
    assert "registering a node's first key is an admin action" in first.json()["error"]["message"]
    unsigned = strict.put(f"/v1/nodes/{NODE}/snapshot", json=report(None), headers=agent)
    assert unsigned.status_code == 403 and unsigned.json()["error"]["code"] == "node_key_required"
    assert strict.get(f"/v1/nodes/{NODE}", headers=ADMIN).status_code == 404
    assert strict.get(f"/v1/nodes/{NODE}/key", headers=ADMIN).status_code == 404

    # The operator registers the node's .pub; the agent's own registration is then accepted.
    by_admin = strict.put(
        f"/v1/nodes/{NODE}/key", json={"public_key": key.public_key}, headers=ADMIN
    )
    assert by_admin.status_code == 200, by_admin.text
    again = strict.put(f"/v1/nodes/{NODE}/key", json={"public_key": key.public_key}, headers=agent)
    assert again.status_code == 200, again.text
    signed = strict.put(f"/v1/nodes/{NODE}/snapshot", json=report(key), headers=agent)
    assert signed.status_code == 200, signed.text


def test_with_trust_on_first_use_an_agent_registers_its_first_key_and_signs(
    trusting: TestClient,
) -> None:
    agent = agent_token(trusting)
    key = NodeKey.generate()
    # Before its key: the agent's unsigned snapshot is refused, as without trust on first use.
    unsigned = trusting.put(f"/v1/nodes/{NODE}/snapshot", json=report(None), headers=agent)
    assert unsigned.status_code == 403 and unsigned.json()["error"]["code"] == "node_key_required"
    first = trusting.put(
        f"/v1/nodes/{NODE}/key", json={"public_key": key.public_key}, headers=agent
    )
    assert first.status_code == 200, first.text
    signed = trusting.put(f"/v1/nodes/{NODE}/snapshot", json=report(key), headers=agent)
    assert signed.status_code == 200, signed.text

    other = NodeKey.generate().public_key
    taken = trusting.put(f"/v1/nodes/{NODE}/key", json={"public_key": other}, headers=agent)
    assert taken.status_code == 409  # a first key only: this name has one
    for refused in (
        trusting.put(
            f"/v1/nodes/{NODE}/key",
            params={"replace": "true"},
            json={"public_key": other},
            headers=agent,
        ),
        trusting.delete(f"/v1/nodes/{NODE}/key", headers=agent),
    ):
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    stored = trusting.get(f"/v1/nodes/{NODE}/key", headers=ADMIN).json()["public_key"]
    assert stored == key.public_key
    replaced = trusting.put(
        f"/v1/nodes/{NODE}/key",
        params={"replace": "true"},
        json={"public_key": other},
        headers=ADMIN,
    )
    assert replaced.status_code == 200 and replaced.json()["public_key"] == other


@pytest.fixture
def grpc_strict(tmp_path: Path) -> Iterator[Running]:
    yield from start(secured(Settings(database_url=f"sqlite:///{tmp_path / 'grpc.sqlite3'}")))


def test_grpc_takes_a_keyless_node_from_an_admin_only(grpc_strict: Running) -> None:
    agent = agent_token(grpc_strict.rest)["Authorization"]
    with pytest.raises(grpc.RpcError) as refused:
        grpc_strict.stub.ReportSnapshot(
            snapshot_request("hgx-h100", NODE), metadata=(("authorization", agent),)
        )
    assert refused.value.code() is grpc.StatusCode.PERMISSION_DENIED
    assert reason(refused.value) == "node_key_required"
    accepted = grpc_strict.stub.ReportSnapshot(
        snapshot_request("hgx-h100", NODE), metadata=(("authorization", ADMIN["Authorization"]),)
    )
    assert accepted.node == NODE
