"""The extender's app with a fake Kubernetes API, in memory or on loopback (HTTP)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.k8s.kube_api import HttpKubeApi
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.k8s.fake_api_server import FakeApiServer
from tests.service.k8s.fake_kube import FakeKubeApi


@pytest.fixture
def kube() -> FakeKubeApi:
    return FakeKubeApi()


@pytest.fixture
def k8s_client(settings: Settings, clock: FakeClock, kube: FakeKubeApi) -> Iterator[TestClient]:
    app = create_app(settings, clock=clock, background=False)
    app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
    app.state.k8s_api = kube
    with TestClient(app) as client:
        yield client


API_TOKEN = "scheduler-sa-token"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(API_TOKEN).start()
    yield server
    server.stop()


@contextlib.contextmanager
def live_app(
    settings: Settings, clock: FakeClock, api: FakeApiServer, **k8s: Any
) -> Iterator[TestClient]:
    """The service with its extender talking HTTP to ``api``: the pod watch, the
    reconciler and the wake-up run as in a cluster (each can be set off in ``k8s``)."""
    app = create_app(settings, clock=clock, background=False)
    options: dict[str, Any] = {"reconcile_interval_s": 0, "wake_nodes": False, **k8s}
    app.state.k8s_settings = ExtenderSettings(**options)
    app.state.k8s_api = HttpKubeApi(api.url, token=lambda: API_TOKEN)
    with TestClient(app) as client:
        yield client
