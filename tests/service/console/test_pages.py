"""The pages and their assets: served from the package, open, relative, offline."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.console.endpoints import ASSETS, STATIC
from service.settings import Settings
from tests.service.conftest import secured

PAGES = ("/docs", "/redoc", "/console")
# src="..." and href="..." in the pages; the console's script builds its URLs the same way.
REFERENCE = re.compile(r'(?:src|href)="([^"]*)"')


@pytest.fixture
def anonymous(settings: Settings) -> Iterator[TestClient]:
    """The service with tokens required, called without one."""
    with TestClient(create_app(secured(settings), background=False)) as test_client:
        yield test_client


@pytest.mark.parametrize("page", PAGES)
def test_each_page_and_what_it_loads_is_open_and_local(anonymous: TestClient, page: str) -> None:
    response = anonymous.get(page)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    references = REFERENCE.findall(response.text)
    assert references
    for reference in references:
        # Relative to the page: no scheme, no host, not even the root, so a prefix works.
        assert not reference.startswith(("http:", "https:", "//", "/")), reference
        if reference.startswith("assets/"):
            asset = anonymous.get("/" + reference)
            assert asset.status_code == 200, reference
            assert len(asset.content) > 100, reference


def test_no_shipped_file_names_a_host_to_fetch() -> None:
    for path in STATIC.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"https?://", text.replace("http://www.w3.org/2000/svg", "")), path


def test_swagger_ui_and_redoc_ship_in_the_package() -> None:
    docs = ASSETS["/assets/docs"]
    for name in ("swagger-ui-bundle.js", "swagger-ui.css", "redoc.standalone.js"):
        assert (docs / name).stat().st_size > 100_000, name


def test_the_pages_work_under_a_path_prefix(settings: Settings) -> None:
    """Behind a proxy that keeps the prefix and tells the service (``root_path``)."""
    app = create_app(secured(settings), background=False)
    with TestClient(app, root_path="/topoplace") as prefixed:
        for page in PAGES:
            assert prefixed.get(f"/topoplace{page}").status_code == 200, page
        assert prefixed.get("/topoplace/assets/console/console.js").status_code == 200
        assert prefixed.get("/topoplace/openapi.json").status_code == 200


def test_unknown_asset_is_a_404(anonymous: TestClient) -> None:
    assert anonymous.get("/assets/console/nothing.js").status_code == 404
