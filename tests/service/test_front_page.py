"""GET /: a pointer to the docs, the health routes and (when served) the console."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from fastapi.testclient import TestClient

from service import front_page
from service.access import OPEN_PATHS
from service.app import create_app
from service.settings import Settings

TOKEN = "s3cret-0123456789abcdef"


def _client(tmp_path: Path) -> TestClient:
    url = f"sqlite:///{tmp_path / 'front.sqlite3'}"
    settings = Settings(database_url=url, api_tokens=TOKEN, insecure_dev=False)
    return TestClient(create_app(settings, background=False))


def test_json_for_a_program_without_a_token(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        answer = client.get("/")
        assert answer.status_code == 200
        assert answer.json() == {
            "service": "topoplace",
            "docs": "/docs",
            "redoc": "/redoc",
            "openapi": "/openapi.json",
            "health": ["/healthz", "/readyz"],
            "console": "/console",
        }
        # Every link it gives is open too.
        for path in ("/docs", "/redoc", "/openapi.json", "/healthz", "/readyz", "/console"):
            assert client.get(path).status_code == 200, path


def test_a_page_for_a_browser(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        answer = client.get("/", headers={"Accept": "text/html,application/xhtml+xml"})
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
        assert '<a href="/docs">' in answer.text and '<a href="/healthz">' in answer.text
        assert '<a href="/console">console</a>' in answer.text


def test_pages_are_linked_only_when_the_app_serves_them() -> None:
    # The front page in an application of its own, without a console: none is linked ...
    bare = FastAPI()
    bare.include_router(front_page.router)
    with TestClient(bare) as client:
        found = client.get("/").json()
        assert "console" not in found and found["docs"] == "/docs"
        assert "/console" not in client.get("/", headers={"Accept": "text/html"}).text

        # ... and once the application serves one (decided per request), it is.
        @bare.get("/console", include_in_schema=False)
        def console() -> PlainTextResponse:
            return PlainTextResponse("console")

        assert client.get("/").json()["console"] == "/console"
        page = client.get("/", headers={"Accept": "text/html"}).text
        assert '<a href="/console">console</a>' in page


def test_redoc_is_open_exactly_when_docs_is(tmp_path: Path) -> None:
    assert ("/docs" in OPEN_PATHS) == ("/redoc" in OPEN_PATHS)
    with _client(tmp_path) as client:
        assert client.get("/docs").status_code == client.get("/redoc").status_code == 200
        rest = client.get("/v1/nodes")
        assert rest.status_code == 401, rest.text  # the rest still asks for a token


def test_an_unknown_path_points_at_the_docs(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        token = {"Authorization": f"Bearer {TOKEN}"}
        answer = client.get("/v1/no-such-thing", headers=token)
        assert answer.status_code == 404
        error = answer.json()["error"]
        assert error["code"] == "not_found" and "/docs" in error["message"]
