"""`topoplace audit` against a real service over HTTP, with an admin token."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from topoplace.cli import main

ADMIN = "audit-admin-token-0123456789abcdef"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_log_shows_who_did_what_and_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'audit.sqlite3'}"
    settings = Settings(database_url=url, insecure_dev=False, bootstrap_admin_token=ADMIN)
    with live_server(create_app(settings)) as server:
        monkeypatch.setenv("TOPOPLACE_SERVER", server)
        monkeypatch.setenv("TOPOPLACE_TOKEN", ADMIN)
        as_admin = {"Authorization": f"Bearer {ADMIN}"}
        snap = build_profile("hgx-h100", "h0").model_dump(mode="json")
        reported = httpx.put(
            f"{server}/v1/nodes/h0/snapshot", json={"snapshot": snap}, headers=as_admin
        )
        assert reported.status_code == 200
        code, secret, err = run(capsys, "token", "create", "--role", "scheduler", "--name", "ci")
        assert code == 0, err
        as_scheduler = {"Authorization": f"Bearer {secret.strip()}"}
        ids = [
            httpx.post(
                f"{server}/v1/place", json={"gpus": 1, "job_id": f"j{i}"}, headers=as_scheduler
            ).json()["id"]
            for i in range(3)
        ]

        code, out, err = run(capsys, "audit", "--kind", "allocation", "--limit", "2")
        assert code == 0, err
        lines = out.strip().splitlines()
        assert lines[0].split()[:3] == ["AT", "KIND", "ACTION"]
        assert len(lines) == 3 and ids[2] in lines[1] and ids[1] in lines[2]
        assert "ci (scheduler" in lines[1] and "POST /v1/place" in lines[1]
        assert "more: --cursor" in err
        cursor = err.split("--cursor")[1].split()[0]
        code, out, err = run(capsys, "audit", "--kind", "allocation", "--cursor", cursor, "--json")
        assert code == 0 and [e["allocation_id"] for e in json.loads(out)["entries"]] == [ids[0]]

        code, out, _ = run(capsys, "audit", "--all", "--limit", "1", "--json")
        actions = [e["action"] for e in json.loads(out)["entries"]]
        assert actions == ["placed", "placed", "placed", "token_created"]
        code, out, _ = run(capsys, "audit", "--job-id", "j1", "--json")
        assert [e["allocation_id"] for e in json.loads(out)["entries"]] == [ids[1]]

        monkeypatch.setenv("TOPOPLACE_TOKEN", secret.strip())  # a scheduler may not read it
        code, _, err = run(capsys, "audit")
        assert code == 1 and "forbidden" in err
        monkeypatch.setenv("TOPOPLACE_TOKEN", ADMIN)
        code, _, err = run(capsys, "audit", "--cursor", "nope")
        assert code == 2 and "cursor" in err
