"""Every answer carries the browser's safety headers, and no page may run inline script.

A node's picture (``topology.svg``) opened on its own is a document of this origin, as is
a JSON error echoing what a caller sent: each says what it is (``nosniff``) and runs no
script, whoever named the node, the GPU or the job in it.
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# (method, path, token?, expected status): a page, the picture, JSON, refusals, an asset.
ANSWERS = [
    ("GET", "/", False, 200),
    ("GET", "/console", False, 200),
    ("GET", "/docs", False, 200),
    ("GET", "/docs/oauth2-redirect", False, 200),
    ("GET", "/redoc", False, 200),
    ("GET", "/openapi.json", False, 200),
    ("GET", "/assets/console/console.js", False, 200),
    ("GET", "/v1/nodes/h0/topology.svg", True, 200),
    ("GET", "/v1/nodes", True, 200),
    ("GET", "/v1/nodes/%3Cscript%3Ealert(1)%3C%2Fscript%3E", True, 404),
    ("GET", "/v1/nodes", False, 401),
    ("GET", "/no/such/route", True, 404),
    ("POST", "/v1/place", True, 422),
]


@pytest.fixture
def served(settings: Settings) -> Iterator[TestClient]:
    app = create_app(secured(settings), clock=FakeClock(), background=False)
    with TestClient(app) as client:
        snap = build_profile("dgx1-v100", "h0")
        body = {"snapshot": snap.model_dump(mode="json")}
        assert client.put("/v1/nodes/h0/snapshot", json=body, headers=ADMIN).status_code == 200
        yield client


def _directives(policy: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for part in policy.split(";"):
        words = part.split()
        if words:
            out[words[0]] = words[1:]
    return out


@pytest.mark.parametrize(("method", "path", "token", "status"), ANSWERS)
def test_every_answer_carries_the_safety_headers(
    served: TestClient, method: str, path: str, token: bool, status: int
) -> None:
    answer = served.request(method, path, headers=ADMIN if token else {}, json=[])
    assert answer.status_code == status, answer.text
    headers = answer.headers
    assert headers.get("x-content-type-options") == "nosniff"
    assert headers.get("referrer-policy") == "no-referrer"
    assert headers.get("x-frame-options") == "SAMEORIGIN"
    policy = _directives(headers.get("content-security-policy", ""))
    scripts = policy.get("script-src", policy.get("default-src"))
    assert scripts is not None, f"{path}: no policy for scripts"
    assert "'unsafe-inline'" not in scripts and "*" not in scripts, (path, scripts)
    assert policy.get("frame-ancestors") == ["'self'"], path
    assert policy.get("object-src", policy.get("default-src")) in (["'none'"],), path


def test_the_picture_may_not_load_or_run_anything(served: TestClient) -> None:
    answer = served.get("/v1/nodes/h0/topology.svg", headers=ADMIN)
    policy = _directives(answer.headers["content-security-policy"])
    assert policy["default-src"] == ["'none'"]
    assert "script-src" not in policy  # default-src 'none' covers it
    assert policy["style-src"] == ["'unsafe-inline'"]  # its own <style> and fills


def test_the_oauth2_redirect_page_runs_only_its_own_script(served: TestClient) -> None:
    answer = served.get("/docs/oauth2-redirect")
    [script] = re.findall(r"<script>(.*?)</script>", answer.text, re.S)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    policy = _directives(answer.headers["content-security-policy"])
    assert policy["script-src"] == [f"'sha256-{digest}'"]
