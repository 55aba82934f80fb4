"""The admin API for tokens, as a token revoked while its call waits sees it.

A route runs on a worker thread once one is free: under load a call waits for
one after its token check and after its body has arrived. A token revoked
meanwhile (here: its revocation lands as the route's dependencies are solved,
which is where that wait ends) must make nothing, above all not a new token
for whoever held the revoked one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from service.app import create_app
from service.deps import get_state
from service.settings import Settings
from service.state import ServiceState
from service.tokens import store
from tests.service.conftest import ADMIN_TOKEN, secured


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    settings = secured(Settings(database_url=f"sqlite:///{tmp_path / 'tokens.sqlite3'}"))
    with TestClient(create_app(settings, background=False)) as test_client:
        yield test_client


def _admin_token(client: TestClient) -> tuple[str, str]:
    made = client.post(
        "/v1/tokens",
        json={"role": "admin", "name": "ops"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert made.status_code == 201, made.text
    return made.json()["id"], made.json()["token"]


def _revoked_while_waiting(client: TestClient, token_id: str) -> None:
    """The token's revocation lands (through another replica: in the database, then this
    process's poll) after its call was let in, before its route runs."""
    app: Any = client.app

    async def revoking(request: Request) -> ServiceState:
        state: ServiceState = request.app.state.service
        store.revoke(state.engine, token_id)
        request.app.state.token_check.forget_revoked()
        return state

    app.dependency_overrides[get_state] = revoking


def _live_names(client: TestClient) -> list[str]:
    app: Any = client.app
    return [r.name for r in store.listed(app.state.service.engine)]


def test_a_token_revoked_while_its_call_waited_makes_no_token(client: TestClient) -> None:
    token_id, token = _admin_token(client)
    _revoked_while_waiting(client, token_id)
    made = client.post(
        "/v1/tokens",
        json={"role": "admin", "name": "kept for later"},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert made.status_code == 401, made.text
    assert made.json()["error"]["code"] == "unauthorized"
    assert "kept for later" not in _live_names(client)


def test_a_token_revoked_while_its_call_waited_revokes_nothing(client: TestClient) -> None:
    token_id, token = _admin_token(client)
    other_id, _ = _admin_token(client)
    _revoked_while_waiting(client, token_id)
    revoked = client.delete(f"/v1/tokens/{other_id}", headers={"Authorization": f"Bearer {token}"})
    assert revoked.status_code == 401, revoked.text
    app: Any = client.app
    assert other_id in store.live_ids(app.state.service.engine, [other_id])
