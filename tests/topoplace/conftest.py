"""Fixtures the command-line tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a service on its own SQLite file with the demo cluster, over loopback,
    for one test module."""
    db = tmp_path_factory.mktemp("client") / "t.sqlite3"
    app = create_app(Settings(database_url=f"sqlite:///{db}"), demo=True)
    with live_server(app) as url:
        yield url
