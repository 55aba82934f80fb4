"""kube-scheduler cannot send a bearer token: /k8s/ is open only when a setting says so."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import names_args, pod
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.service.conftest import FakeClock


def _client(settings: Settings, clock: FakeClock, extender_open: bool) -> Iterator[TestClient]:
    app = create_app(
        settings.model_copy(
            update={"api_tokens": "s3cret-0123456789abcdef", "insecure_dev": False}
        ),
        clock=clock,
        background=False,
    )
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0, extender_open=extender_open)
    with TestClient(app) as client:
        yield client


@pytest.fixture
def open_client(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    yield from _client(settings, clock, extender_open=True)


@pytest.fixture
def closed_client(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    yield from _client(settings, clock, extender_open=False)


def test_open_extender_routes_take_calls_without_a_token(open_client: TestClient):
    response = open_client.post("/k8s/v1/filter", json=names_args(pod("p", 1), ["n"]))
    assert response.status_code == 200
    # Everything else still needs the token.
    assert open_client.get("/v1/nodes").status_code == 401
    assert (
        open_client.get(
            "/v1/nodes", headers={"Authorization": "Bearer s3cret-0123456789abcdef"}
        ).status_code
        == 200
    )


def test_closed_extender_routes_need_the_token(closed_client: TestClient):
    response = closed_client.post("/k8s/v1/filter", json=names_args(pod("p", 1), ["n"]))
    assert response.status_code == 401
    authorized = closed_client.post(
        "/k8s/v1/filter",
        json=names_args(pod("p", 1), ["n"]),
        headers={"Authorization": "Bearer s3cret-0123456789abcdef"},
    )
    assert authorized.status_code == 200
