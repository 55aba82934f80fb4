"""A reservation's commit never waits for the connections that reads hold.

Every request that reads the database (a listing, an audit page, a release)
takes a connection from the engine's pool, and FastAPI runs 40 of them at
once on the engine's 15 (SQLite) or 20 (Postgres) connections. The group
committer's batches took theirs from the same pool, so a /v1/place (and a
Slurm submission on Postgres) queued behind every read in flight, and past
the pool's 30 s wait was answered 500. The committer has a pool of its own
now (service/allocations/batch_writer.py): here every connection of the
engine's pool is held, as slow reads hold them, and a /v1/place over real
HTTP is still answered and its GPU stored.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from sqlalchemy.pool import QueuePool

from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from tests.service.conftest import ADMIN_TOKEN, secured

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def app(settings: Settings) -> FastAPI:
    return create_app(secured(settings), background=False)


def _hold_every_connection(engine: sa.Engine) -> list[Any]:
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    # The pool's size and its overflow: all it hands out before a caller must wait.
    most = pool.size() + pool._max_overflow
    held = [pool.connect() for _ in range(most)]
    assert pool.checkedout() == most
    return held


def test_a_place_is_answered_while_reads_hold_every_pooled_connection(app: FastAPI) -> None:
    with (
        live_server(app) as url,
        httpx.Client(base_url=url, headers=ADMIN, timeout=60, trust_env=False) as http,
    ):
        snap = build_profile("dgx-a100", "n0")
        answer = http.put("/v1/nodes/n0/snapshot", json={"snapshot": snap.model_dump(mode="json")})
        assert answer.status_code == 200, answer.text
        engine: sa.Engine = app.state.service.engine
        held = _hold_every_connection(engine)
        try:
            placed = http.post("/v1/place", json={"gpus": 2})
            assert placed.status_code == 201, placed.text
            assert len(placed.json()["tasks"][0]["gpu_uuids"]) == 2
            # A second, racing nothing: the batches still go one after another.
            again = http.post("/v1/place", json={"gpus": 2})
            assert again.status_code == 201, again.text
        finally:
            for connection in held:
                connection.close()
        # Stored as answered: the database holds the GPUs the two answers named.
        named = {g for p in (placed, again) for t in p.json()["tasks"] for g in t["gpu_uuids"]}
        with engine.connect() as conn:
            stored = conn.execute(sa.text("SELECT device FROM gpu_holds WHERE kind = 'gpu'"))
            assert set(stored.scalars()) == named and len(named) == 4
        listed = http.get("/v1/allocations")
        assert listed.status_code == 200
        assert {a["id"] for a in listed.json()["allocations"]} == {
            placed.json()["id"],
            again.json()["id"],
        }
