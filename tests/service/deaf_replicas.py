"""Replicas on one database that hear no other replica's change unless they read it.

A replica's notification listener (service/notify.py) would catch up within
milliseconds on Postgres, sometimes before the request a test sends it: tests of
"a replica behind" replace it with one that hears nothing (``deaf_listener``,
used with ``pytest.mark.usefixtures``), and start each replica without its
background loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import app as app_module
from service import schema
from service.app import create_app
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.k8s.fake_kube import FakeKubeApi


class DeafListener:
    """A notification listener that hears nothing: the replica behind stays behind."""

    def __init__(self, *_: object, **__: object) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture
def deaf_listener(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(app_module, "Listener", DeafListener)


@contextlib.contextmanager
def replica(
    settings: Settings, clock: FakeClock, kube: FakeKubeApi | None = None
) -> Iterator[TestClient]:
    """A replica on the settings' database; with ``kube``, its Kubernetes API (the pod
    reconciler off, so that only the calls a test makes change anything)."""
    app = create_app(settings, clock=clock, background=False)
    if kube is not None:
        app.state.k8s_settings = ExtenderSettings(reconcile_interval_s=0)
        app.state.k8s_api = kube
    with TestClient(app) as client:
        yield client


def held(client: TestClient) -> set[tuple[str, str]]:
    """(node, device) of every hold in the database."""
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    holds = schema.gpu_holds
    with state.engine.connect() as conn:
        rows = conn.execute(sa.select(holds.c.node, holds.c.device)).all()
    return {(str(node), str(device)) for node, device in rows}
