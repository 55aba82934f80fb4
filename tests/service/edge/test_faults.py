"""A fault is answered 500 in the error shape, and the connection stays usable."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server


def _faulty_app(database_url: str) -> FastAPI:
    app = create_app(Settings(database_url=database_url), background=False)

    @app.get("/v1/fault")
    def fault() -> None:
        raise RuntimeError("a bug")

    return app


def test_a_500_keeps_the_keep_alive_connection(database_url: str) -> None:
    with live_server(_faulty_app(database_url)) as url:
        with httpx.Client(base_url=url, trust_env=False) as client:
            first = client.get("/v1/fault")
            assert first.status_code == 500
            assert first.json()["error"]["code"] == "internal_error"
            assert "a bug" not in first.text  # the fault is in the log, not in the answer
            assert first.headers.get("connection") != "close"
            streams = [first.extensions["network_stream"]]
            second = client.get("/healthz")
            streams.append(second.extensions["network_stream"])
            assert second.status_code == 200
        assert streams[0] is streams[1], "the client had to open a new connection after the 500"
