"""A real headless Chromium (Debian's, through its chromium-driver) against `topoplace serve`.

The suite needs Debian's ``chromium`` and ``chromium-driver`` packages and selenium. Without
them it is skipped with a message saying what is missing, unless
TOPOPLACE_REQUIRE_BROWSER=1 (.ci/run sets it after installing them), when that is a
failure instead. Screenshots go to TOPOPLACE_ARTEFACTS (default: a pytest temporary
folder); the path is printed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.service.console.browser.harness import Browser, Served, start_browser, start_service

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
ADMIN_TOKEN = "browser-admin-token-0123456789abcdef"


def missing_prerequisites() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path, package in ((CHROMIUM, "chromium"), (DRIVER, "chromium-driver")):
        if not (os.access(path, os.X_OK) or shutil.which(Path(path).name)):
            return f"{path} is missing (apt-get install {package})"
    return None


@pytest.fixture(scope="session", autouse=True)
def _prerequisites() -> None:
    why = missing_prerequisites()
    if why is None:
        return
    message = f"the browser tests need Debian's Chromium: {why}"
    if os.environ.get("TOPOPLACE_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def artefacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = os.environ.get("TOPOPLACE_ARTEFACTS")
    path = Path(folder) if folder else tmp_path_factory.mktemp("browser-artefacts")
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nbrowser screenshots: {path}")
    return path


@pytest.fixture(scope="package")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`topoplace serve --demo`: the simulated cluster, callers without a token are admins."""
    served = start_service(tmp_path_factory.mktemp("demo"), ["--demo"], {})
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="package")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`topoplace serve` with tokens required, the demo fleet reported by an admin."""
    env = {"TOPOPLACE_BOOTSTRAP_ADMIN_TOKEN": ADMIN_TOKEN}
    served = start_service(tmp_path_factory.mktemp("secured"), [], env, token=ADMIN_TOKEN)
    try:
        served.report_demo_fleet()
        yield served
    finally:
        served.stop()


@pytest.fixture
def browser(artefacts: Path) -> Iterator[Browser]:
    opened = start_browser(CHROMIUM, DRIVER, artefacts)
    try:
        yield opened
    finally:
        opened.quit()
