"""A token revoked through one replica is refused by the other within a second."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from service import migrate
from tests.service.conftest import ADMIN_TOKEN
from tests.service.replica_processes import replicas

ENV = {"TOPOPLACE_INSECURE_DEV": "0", "TOPOPLACE_BOOTSTRAP_ADMIN_TOKEN": ADMIN_TOKEN}
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_revocation_reaches_every_replica_within_a_second(postgres_url: str) -> None:
    migrate.upgrade(postgres_url)  # once, before two processes would race to
    with replicas(postgres_url, 2, ENV) as running, httpx.Client(trust_env=False) as http:
        first, second = running.urls
        created = http.post(f"{first}/v1/tokens", json={"role": "viewer"}, headers=ADMIN)
        assert created.status_code == 201, created.text
        viewer = {"Authorization": f"Bearer {created.json()['token']}"}
        # Both replicas verify the token and keep it in their caches.
        for url in running.urls:
            assert http.get(f"{url}/v1/nodes", headers=viewer).status_code == 200
        revoked = http.delete(f"{first}/v1/tokens/{created.json()['id']}", headers=ADMIN)
        assert revoked.status_code == 204
        started = time.monotonic()
        assert http.get(f"{first}/v1/nodes", headers=viewer).status_code == 401
        while http.get(f"{second}/v1/nodes", headers=viewer).status_code == 200:
            assert time.monotonic() - started < 1.0, "the other replica still accepts it"
            time.sleep(0.02)
        print(f"refused by the other replica after {time.monotonic() - started:.3f} s")


def test_serve_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "TOPOPLACE_DATABASE_URL": f"sqlite:///{tmp_path / 'refuse.sqlite3'}",
        "TOPOPLACE_INSECURE_DEV": "0",
    }
    for name in ("TOPOPLACE_API_TOKENS", "TOPOPLACE_API_TOKEN_FILE"):
        env.pop(name, None)
    env.pop("TOPOPLACE_BOOTSTRAP_ADMIN_TOKEN", None)
    done = subprocess.run(
        [sys.executable, "-m", "topoplace", "serve", "--no-grpc", "--port", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "refusing to start without API tokens" in done.stderr
    assert "--insecure-dev" in done.stderr
