"""The HTTP client against a real service: uvicorn on loopback, SQLite.

The client commands' tests (tests/topoplace/test_client_cmd.py) go through
this client too; here are the methods no command uses and the two failures.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from tests.topoplace.test_client_cmd import PROXY_VARIABLES
from topoplace_client.api import ApiError, ServiceUnreachable, TopoplaceClient, normalize_server_url


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("api") / "t.sqlite3"
    with live_server(create_app(Settings(database_url=f"sqlite:///{db}"))) as url:
        yield url


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # A proxy from the environment must not sit between the client and loopback.
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_server_urls_are_normalized() -> None:
    assert normalize_server_url(" svc:8080/ ") == "http://svc:8080"
    assert normalize_server_url("https://svc") == "https://svc"
    for bad in ("ftp://svc", "http://"):
        with pytest.raises(ValueError):
            normalize_server_url(bad)


def test_client_methods_for_the_rest_of_the_api(server: str) -> None:
    snap = build_profile("hgx-h100", "client-extra").model_dump(mode="json")
    with TopoplaceClient(server, timeout=5) as api:
        assert api.health() == {"status": "ok"}
        assert api.ready()["status"] == "ready"
        assert api.put_snapshot("client-extra", snap)["node"] == "client-extra"
        api.heartbeat("client-extra")
        assert api.cordon("client-extra")["state"] == "cordoned"
        assert api.uncordon("client-extra")["state"] == "ready"
        assert api.snapshots("client-extra")[0]["seq"] == snap["seq"]
        scored = api.score({"gpus": 8, "nodes": ["client-extra"]})["nodes"]
        assert scored[0]["node"] == "client-extra" and scored[0]["fits"] is True

        placed = api.place({"gpus": 2, "nodes": ["client-extra"], "job_id": "api-job"})
        assert api.allocation(placed["id"])["id"] == placed["id"]
        assert api.extend(placed["id"], 120)["state"] == "pending"
        assert api.confirm(placed["id"])["state"] == "active"
        with pytest.raises(ApiError) as refused:
            api.delete_node("client-extra")  # it holds GPUs
        assert refused.value.code == "conflict" and refused.value.status == 409
        assert api.release_job("api-job") == {"released": [placed["id"]]}
        api.delete_node("client-extra")

        with pytest.raises(ApiError) as missing:
            api.node("client-extra")
        error = missing.value
        assert (error.code, error.status) == ("not_found", 404)
        assert error.body == {
            "error": {"code": "not_found", "message": error.message, "detail": {}}
        }
        with pytest.raises(ApiError) as invalid:
            api.place({"gpus": 0})
        assert invalid.value.detail["field"] == "gpus"

    with pytest.raises(ServiceUnreachable) as unreachable:
        TopoplaceClient("127.0.0.1:1", timeout=1).cluster()
    assert isinstance(unreachable.value, ConnectionError)
    assert str(unreachable.value).startswith("cannot reach topoplace at http://127.0.0.1:1: ")
    with pytest.raises(ValueError):
        TopoplaceClient("ftp://example.org")


@pytest.mark.parametrize(
    ("status", "later"),
    [(429, True), (500, True), (503, True), (502, True), (409, False), (401, False), (422, False)],
)
def test_try_later_is_a_rate_limit_or_a_failing_service(status: int, later: bool) -> None:
    error = ApiError("some_code", "said so", status, retry_after="3")
    assert error.try_later is later
    assert error.line() == "some_code: said so" + ("; try again later (Retry-After: 3)" * later)
    assert ApiError("c", "m", status).line() == "c: m"  # no Retry-After, none named


def test_an_empty_key_reaches_both_place_routes(server: str) -> None:
    # An empty key (an unset variable passed on) is refused by the service, not dropped:
    # dropped, the federated place went out with no key, and a retry of it, after an
    # answer lost, could place the job a second time; /v1/place's refused it.
    with TopoplaceClient(server, timeout=5) as api:
        for place in (api.place, api.federation_place):
            with pytest.raises(ApiError) as refused:
                place({"gpus": 1}, idempotency_key="")
            assert refused.value.code == "invalid_request", refused.value.line()
            assert refused.value.detail["field"] == "header.idempotency-key"
