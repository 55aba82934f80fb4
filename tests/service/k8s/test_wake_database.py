"""The database really goes away and comes back: one wake-up when the service is ready again.

The service reaches Postgres through a TCP proxy that the test cuts (every
connection closed, new ones refused) and restores. While the database is
gone /readyz is 503 and nothing is patched; once it answers again each GPU
node is labelled exactly once, and not at all with the wake-up switched off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_api_server import FakeApiServer
from tests.service.k8s.fixtures import live_app
from tests.service.tcp_cut import TcpCut
from tests.waiting import wait_until


@pytest.fixture
def proxied(doomed_database: tuple[str, sa.Engine]) -> Iterator[tuple[Settings, TcpCut]]:
    url = sa.make_url(doomed_database[0])
    with TcpCut(url.host or "127.0.0.1", url.port or 5432) as cut:
        through = url.set(host="127.0.0.1", port=cut.port).render_as_string(hide_password=False)
        yield Settings(database_url=through, heartbeat_ttl_s=60, reservation_ttl_s=120), cut


def _k8s(client: TestClient) -> Any:
    return client.app.state.k8s  # type: ignore[attr-defined]


def _ready(client: TestClient) -> int:
    return client.get("/readyz").status_code


def _outage(client: TestClient, cut: TcpCut) -> None:
    """The database goes away for a few readiness checks, then comes back."""
    cut.cut()
    wait_until(lambda: _ready(client) == 503, "/readyz says the database is gone")
    cut.restore()
    wait_until(lambda: _ready(client) == 200, "/readyz says the database is back")


def test_the_wake_up_follows_the_database_coming_back_once(
    proxied: tuple[Settings, TcpCut], clock: FakeClock, api: FakeApiServer
) -> None:
    settings, cut = proxied
    api.add_node("h100-a")
    api.add_node("h100-b")
    with live_app(settings, clock, api) as client:  # the agents report before this start
        add_nodes(client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"))
    with live_app(settings, clock, api, wake_nodes=True) as client:
        wake = _k8s(client).wake
        wait_until(lambda: wake.wake_ups == 1, "the wake-up at start")
        assert len(api.patches) == 2
        cut.cut()
        wait_until(lambda: _ready(client) == 503, "/readyz says the database is gone")
        checks = wake.checks
        wait_until(lambda: wake.checks >= checks + 2, "readiness checked while it is gone")
        assert wake.wake_ups == 1 and len(api.patches) == 2  # nothing while not ready
        cut.restore()
        wait_until(lambda: wake.wake_ups == 2, "the wake-up once the database is back")
        assert sorted(name for name, _ in api.patches[2:]) == ["h100-a", "h100-b"]
        checks = wake.checks
        wait_until(lambda: wake.checks >= checks + 2, "two more readiness checks")
        assert wake.wake_ups == 2 and len(api.patches) == 4  # once, not once a check


def test_no_wake_up_after_the_outage_when_switched_off(
    proxied: tuple[Settings, TcpCut], clock: FakeClock, api: FakeApiServer
) -> None:
    settings, cut = proxied
    api.add_node("h100-a")
    with live_app(settings, clock, api, wake_nodes=False) as client:
        add_nodes(client, ("hgx-h100", "h100-a"))
        assert _k8s(client).wake is None
        _outage(client, cut)
        wait_until(lambda: _k8s(client).watcher.following, "the service follows pods")
    assert api.patches == []
