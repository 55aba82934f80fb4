"""When the database goes away: 503 with Retry-After, and nothing half-written."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import database_unreachable
from service.app import create_app
from service.log_gate import LogGate
from service.settings import Settings
from service.tokens import secrets
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes


def test_place_and_readyz_answer_503_when_the_database_is_gone(
    doomed_database: tuple[str, sa.Engine],
) -> None:
    url, admin = doomed_database
    app = create_app(Settings(database_url=url), clock=FakeClock(), background=False)
    with TestClient(app) as client:
        add_nodes(client, ("hgx-h100", "h0"))
        free_before = client.get("/v1/nodes/h0").json()["free_gpus"]
        name = sa.make_url(url).database
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        response = client.post("/v1/place", json={"gpus": 2})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "database_unavailable"
        assert response.headers["Retry-After"] == "5"
        ready = client.get("/readyz")
        assert ready.status_code == 503 and ready.headers["Retry-After"] == "5"
        # The tentative choice was undone: memory still shows every GPU free.
        state = client.app.state.service  # type: ignore[attr-defined]
        entry = state.cluster.node("h0")
        assert [
            g.index for g in entry.snapshot.gpus if entry.free_mask >> g.index & 1
        ] == free_before
        with admin.connect() as conn:  # give the fixture a database to drop
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))


# What a driver says when it cannot connect: the database's host, port, name and user.
DRIVER_TEXT = (
    'connection to server at "db-7.internal.example" (10.1.2.3), port 5433 failed:'
    ' FATAL:  password authentication failed for user "topoplace_rw"'
)
SECRETS = ("db-7.internal.example", "10.1.2.3", "5433", "topoplace_rw")


def _refuses_connections(*_: object, **__: object) -> None:
    raise sa.exc.OperationalError("SELECT 1", {}, Exception(DRIVER_TEXT))


def test_an_unauthenticated_caller_is_not_told_where_the_database_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """/readyz is open to anyone; it answered the driver's words, which name the database's
    host, port and user. So did a check of a token the process had not seen yet."""
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'down.sqlite3'}",
        api_tokens="s3cret-0123456789abcdef",
        insecure_dev=False,
    )
    app = create_app(settings, clock=FakeClock(), background=False)
    with TestClient(app) as client:
        monkeypatch.setattr(app.state.service.engine, "connect", _refuses_connections)
        monkeypatch.setattr(database_unreachable, "_logged", LogGate())  # none logged lately
        caplog.set_level(logging.WARNING)
        unknown = secrets.compose(secrets.new_id(), secrets.new_secret())
        answers = {
            "/readyz": client.get("/readyz"),
            "a token not seen yet": client.get(
                "/v1/nodes", headers={"Authorization": f"Bearer {unknown}"}
            ),
        }
        for what, answer in answers.items():
            assert answer.status_code == 503, what
            assert answer.headers["Retry-After"] == "5", what
            error = answer.json()["error"]
            assert error["code"] == "database_unavailable", what
            assert "database" in error["message"], what
            for secret in SECRETS:
                assert secret not in answer.text, f"{what} told {secret!r}: {answer.text}"
        # The operator reads the driver's words in the service's log instead.
        assert DRIVER_TEXT in caplog.text


def test_readyz_names_no_host_or_database_when_postgres_is_gone(
    doomed_database: tuple[str, sa.Engine],
) -> None:
    url, admin = doomed_database
    settings = Settings(database_url=url, api_tokens="s3cret-0123456789abcdef", insecure_dev=False)
    app = create_app(settings, clock=FakeClock(), background=False)
    with TestClient(app) as client:
        name = sa.make_url(url).database
        assert name is not None
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
        host, user = sa.make_url(url).host, sa.make_url(url).username
        # The first answer finds the pooled connection cut; the next ones connect anew, and
        # the server's refusal names the database (and the driver the host and port).
        for _ in range(3):
            ready = client.get("/readyz")
            assert ready.status_code == 503
            assert ready.json()["error"]["code"] == "database_unavailable"
            for secret in (name, host, user):
                assert secret is not None and secret not in ready.text, ready.text
        with admin.connect() as conn:  # give the fixture a database to drop
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
