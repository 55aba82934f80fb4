"""`topoplace token create|list|revoke`, against a real service secured by its own tokens."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import NoTokenSource, create_app
from service.settings import Settings
from tests.live_server import live_server
from topoplace.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_bootstrap_then_make_list_and_revoke_through_the_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'tokens.sqlite3'}"
    settings = Settings(database_url=url, insecure_dev=False)
    with pytest.raises(NoTokenSource), TestClient(create_app(settings)):
        pass  # no token anywhere yet: the service refuses to start

    code, admin, err = run(
        capsys, "token", "create", "--database-url", url, "--role", "admin", "--name", "ops"
    )
    assert code == 0, err
    admin = admin.strip()
    assert admin.startswith("tpp_") and "admin" in err

    with live_server(create_app(settings)) as server:
        monkeypatch.setenv("TOPOPLACE_SERVER", server)
        monkeypatch.setenv("TOPOPLACE_TOKEN", admin)
        code, agent, err = run(
            capsys, "token", "create", "--role", "agent", "--node", "gpu-1", "--node", "gpu-2"
        )
        assert code == 0, err
        agent = agent.strip()
        assert "gpu-1, gpu-2" in err

        code, out, _ = run(capsys, "token", "list", "--json")
        listed = json.loads(out)["tokens"]
        assert [t["role"] for t in listed] == ["admin", "agent"]
        assert admin not in out and agent not in out
        code, table, _ = run(capsys, "token", "list")
        assert "gpu-1, gpu-2" in table and "ops" in table

        as_agent = {"Authorization": f"Bearer {agent}"}
        assert httpx.get(f"{server}/v1/nodes", headers=as_agent).status_code == 403
        beat = httpx.post(f"{server}/v1/nodes/gpu-1/heartbeat", headers=as_agent)
        assert beat.status_code == 404  # allowed; the node has not reported yet

        agent_id = listed[1]["id"]
        code, out, err = run(capsys, "token", "revoke", agent_id)
        assert code == 0 and agent_id in out, err
        assert httpx.post(f"{server}/v1/nodes/gpu-1/heartbeat", headers=as_agent).status_code == 401
        code, out, _ = run(capsys, "token", "list", "--revoked", "--json")
        assert [t["revoked_at"] is not None for t in json.loads(out)["tokens"]] == [False, True]

        # Not an admin: the API says so, and the command exits 1 naming the role needed.
        monkeypatch.setenv("TOPOPLACE_TOKEN", agent)
        code, _, err = run(capsys, "token", "list")
        assert code == 1 and "unauthorized" in err
        code, _, err = run(capsys, "token", "revoke", "nope")
        assert code == 1


def test_an_agent_token_needs_a_scope(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'tokens.sqlite3'}"
    code, out, err = run(capsys, "token", "create", "--database-url", url, "--role", "agent")
    assert code == 2 and not out and "needs a scope" in err
