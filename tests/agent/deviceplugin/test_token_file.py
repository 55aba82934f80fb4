"""A rotated token: the plugin reads the agent's token file again on a 401 and retries."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.deviceplugin.daemon import ServiceLink
from agent.deviceplugin.token_file import TokenFile, read_token
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from tests.topoplace.test_client_cmd import PROXY_VARIABLES
from topoplace_client.api import ApiError, TopoplaceClient

ADMIN = "dp-admin-token-0123456789abcdef"
NODE = "dp-rotate"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[TopoplaceClient]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 't.db'}", api_tokens=ADMIN)
    with live_server(create_app(settings)) as url, TopoplaceClient(url, token=ADMIN) as client:
        client.put_snapshot(NODE, build_profile("hgx-h100", NODE).model_dump(mode="json"))
        yield client


def test_a_rotated_token_is_read_again_and_the_call_made_again(
    admin: TopoplaceClient, tmp_path: Path
) -> None:
    path = tmp_path / "agent.token"
    old = admin.create_token("agent", nodes=[NODE])
    path.write_text(f"{old['token']}\n")
    token = read_token(path)
    clients = [TopoplaceClient(admin.server, token=token) for _ in range(2)]
    link = ServiceLink(NODE, clients[0], clients[1], TokenFile(path, clients, token))
    try:
        assert link.reservations() == []
        new = admin.create_token("agent", nodes=[NODE])
        path.write_text(f"{new['token']}\n")
        admin.revoke_token(str(old["id"]))
        # Was: 401 on every call (admissions unmatched, nothing reported) until a restart.
        assert link.reservations() == []
        assert link.reservations_for_report() == []
        admin.revoke_token(str(new["id"]))  # the file holds no newer token: refused
        with pytest.raises(ApiError) as refused:
            link.reservations()
        assert refused.value.status == 401
    finally:
        for client in clients:
            client.close()
