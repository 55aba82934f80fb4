"""Routes answered before FastAPI's router: the handler serves them, errors keep the one shape."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.testclient import TestClient
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from service.app import create_app
from service.direct_routes import DirectRoutes, route_path
from service.errors import NotFound
from service.settings import Settings
from service.slurm import endpoints as slurm_routes


def _app(handler_error: Exception | None = None) -> FastAPI:
    app = FastAPI()

    @app.post("/x")
    def routed() -> dict[str, str]:
        return {"by": "router"}

    @app.post("/y")
    def other() -> dict[str, str]:
        return {"by": "router"}

    async def direct(request: Request) -> Response:
        if handler_error is not None:
            raise handler_error
        return JSONResponse({"by": "direct", "body": (await request.body()).decode()})

    app.add_middleware(DirectRoutes, routes={("POST", "/x"): direct})
    return app


def test_the_listed_method_and_path_go_to_the_handler_and_the_rest_to_the_router() -> None:
    with TestClient(_app()) as client:
        assert client.post("/x", content=b"job").json() == {"by": "direct", "body": "job"}
        assert client.post("/y").json() == {"by": "router"}
        assert client.get("/x").status_code == 405  # the router's answer for the method


def test_the_path_is_matched_below_the_root_path() -> None:
    with TestClient(_app(), root_path="/api") as client:
        assert client.post("/api/x").json()["by"] == "direct"


@pytest.mark.parametrize(
    ("path", "root", "expected"),
    [
        ("/v1/x", "", "/v1/x"),
        ("/api/v1/x", "/api", "/v1/x"),
        ("/api", "/api", ""),
        ("/apix/v1", "/api", "/apix/v1"),  # not the mount point's segment
        ("/other/v1", "/api", "/other/v1"),
    ],
)
def test_route_path_strips_the_mount_point_as_the_router_does(
    path: str, root: str, expected: str
) -> None:
    scope = {"type": "http", "path": path, "root_path": root}
    assert route_path(scope) == expected


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (NotFound("no node 'n9'"), 404, "not_found"),
        (RequestValidationError([{"loc": ("body", "gpus"), "msg": "bad"}]), 422, "invalid_request"),
        (sa.exc.OperationalError("SELECT 1", {}, Exception("gone")), 503, "database_unavailable"),
    ],
)
def test_errors_get_the_applications_one_shape(error: Exception, status: int, code: str) -> None:
    with TestClient(_app(error)) as client:
        response = client.post("/x")
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_a_fault_in_the_handler_is_a_500_not_a_hang() -> None:
    with TestClient(_app(RuntimeError("bug")), raise_server_exceptions=False) as client:
        assert client.post("/x").status_code == 500


def test_job_submit_is_served_directly_and_still_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    handler = slurm_routes.handle_job_submit

    async def counted(request: Request) -> Response:
        calls.append(request.url.path)
        return await handler(request)

    monkeypatch.setitem(slurm_routes.DIRECT, ("POST", "/v1/slurm/job-submit"), counted)
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'direct.sqlite3'}")
    with TestClient(create_app(settings, background=False)) as client:
        answer = client.post("/v1/slurm/job-submit", json={"tres_per_node": "gres:gpu:1"})
        schema = client.get("/openapi.json").json()
    assert answer.status_code == 200
    assert answer.json()["action"] == "unchanged"  # no nodes known yet
    assert calls == ["/v1/slurm/job-submit"]
    assert "/v1/slurm/job-submit" in schema["paths"]
