"""The extender's app with a fake Kubernetes API, for every test that binds pods."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from tests.service.conftest import FakeClock
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
