"""Agent test fixtures: the service tests' Postgres database (the end-to-end test), and
the real service behind a scripted front (tests/agent/scripted_front.py)."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from service.app import create_app
from service.settings import Settings
from tests.agent.scripted_front import ScriptedFront
from tests.live_server import live_server
from tests.service.conftest import postgres_url

__all__ = ["front", "postgres_url"]


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[str, ScriptedFront]]:
    """A real service on loopback (its URL) behind a front that answers what a test
    scripts (429s, 503s, redirects, a proxy's page) before the service does."""
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'service.db'}"))
    scripted = ScriptedFront(app)
    with live_server(app) as url:
        yield url, scripted
