"""Bearer tokens: one check in front of every route but health and the docs."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth import TokenCheck, Unauthorized
from service.settings import Settings
from topoplace_client.api import ApiError, TopoplaceClient


def _client(tmp_path: Path, **settings: str) -> TestClient:
    url = f"sqlite:///{tmp_path / 'auth.sqlite3'}"
    return TestClient(create_app(Settings(database_url=url, **settings), background=False))


def test_without_tokens_the_api_is_open(tmp_path: Path) -> None:
    with _client(tmp_path) as client:
        assert client.get("/v1/nodes").status_code == 200


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "requires a token"),
        ("Bearer wrong", "not one this service accepts"),
        ("Basic czNjcmV0", "must be 'Bearer TOKEN'"),
        ("Bearer ", "must be 'Bearer TOKEN'"),
    ],
)
def test_a_missing_or_wrong_token_is_refused(
    tmp_path: Path, header: str | None, message: str
) -> None:
    with _client(tmp_path, api_tokens="s3cret,other") as client:
        headers = {"Authorization": header} if header else {}
        response = client.post("/v1/place", json={"gpus": 1}, headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"
        error = response.json()["error"]
        assert error["code"] == "unauthorized"
        assert message in error["message"]


def test_every_configured_token_is_accepted(tmp_path: Path) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text("# agents\nfrom-file\n\n")
    with _client(tmp_path, api_tokens="s3cret", api_token_file=str(token_file)) as client:
        for token in ("s3cret", "from-file"):
            response = client.get("/v1/nodes", headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 200, token
        assert client.get("/v1/nodes", headers={"Authorization": "Bearer # agents"}).status_code
        assert client.get("/v1/nodes").status_code == 401


def test_health_and_docs_stay_open(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens="s3cret") as client:
        for path in ("/healthz", "/readyz", "/openapi.json", "/docs"):
            assert client.get(path).status_code == 200, path


def test_an_unreadable_token_file_is_a_clear_startup_error(tmp_path: Path) -> None:
    settings = Settings(database_url="sqlite://", api_token_file=str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="cannot read the token file"):
        settings.accepted_tokens()


def test_the_check_itself() -> None:
    check = TokenCheck(["a", ""])
    assert check.enabled
    check.verify("bearer a")
    with pytest.raises(Unauthorized):
        check.verify("Bearer b")
    TokenCheck([]).verify(None)  # open


def test_the_client_sends_its_token(tmp_path: Path) -> None:
    with _client(tmp_path, api_tokens="s3cret") as app_client:
        transport = httpx.MockTransport(
            lambda request: httpx.Response(
                app_client.get(
                    request.url.path,
                    headers={"Authorization": request.headers.get("authorization", "")},
                ).status_code,
                json={"nodes": []},
            )
        )
        with TopoplaceClient("http://svc", transport=transport, token="s3cret") as good:
            assert good.nodes() == {"nodes": []}
        with (
            TopoplaceClient("http://svc", transport=transport) as anonymous,
            pytest.raises(ApiError),
        ):
            anonymous.nodes()
