"""A request that names no route gets 404 or 405, whoever asks, and is never redirected.

Before, ``POST /v1/place/`` (a trailing slash) told a scheduler "this call needs
the admin role", and redirected an admin's write (307) to ``/v1/place``; a
wrong method or an unknown path told every caller but an admin the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.helpers import add_nodes

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
ROLES = ("admin", "scheduler", "viewer", "agent")


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    app = create_app(secured(settings), background=False)
    with TestClient(app, headers=ADMIN, follow_redirects=False) as test_client:
        add_nodes(test_client, ("dgx-a100", "n1"))
        yield test_client


def _tokens(client: TestClient) -> dict[str, dict[str, str]]:
    made = {"admin": ADMIN}
    for role in ROLES[1:]:
        body: dict[str, Any] = {"role": role, **({"nodes": ["n1"]} if role == "agent" else {})}
        answer = client.post("/v1/tokens", json=body)
        assert answer.status_code == 201, answer.text
        made[role] = {"Authorization": f"Bearer {answer.json()['token']}"}
    return made


WRITES_WITH_A_SLASH = [
    ("POST", "/v1/place/", {"gpus": 1}),
    ("POST", "/v1/place//", {"gpus": 1}),
    ("POST", "/v1/score/", {"gpus": 1}),
    ("PUT", "/v1/nodes/n1/snapshot/", {}),
    ("POST", "/v1/nodes/n1/heartbeat/", None),
    ("POST", "/v1/nodes/n1/cordon/", None),
    ("DELETE", "/v1/nodes/n1/", None),
    ("POST", "/v1/slurm/job-submit/", {}),  # a direct route, served before the router
    ("POST", "/k8s/v1/bind/", {}),
    ("POST", "/v1/tokens/", {"role": "admin"}),
]


@pytest.mark.parametrize(("method", "path", "body"), WRITES_WITH_A_SLASH)
def test_a_write_with_a_trailing_slash_is_no_route_for_every_role(
    client: TestClient, method: str, path: str, body: Any
) -> None:
    for role, headers in _tokens(client).items():
        answer = client.request(method, path, json=body, headers=headers)
        assert answer.status_code == 404, (role, answer.text)
        assert "location" not in answer.headers, role
        error = answer.json()["error"]
        assert error["code"] == "not_found"
        assert error["detail"]["route"] == path.rstrip("/")
        assert "do not end with '/'" in error["message"]
        assert "role" not in error["message"], role
    # Nothing was written for any of them: no reservation, no cordon, no token, the node kept.
    assert client.get("/v1/allocations").json()["allocations"] == []
    assert client.get("/v1/nodes/n1").json()["state"] == "ready"
    assert [t["role"] for t in client.get("/v1/tokens").json()["tokens"]] == list(ROLES[1:])


def test_a_read_with_a_trailing_slash_is_no_route_either(client: TestClient) -> None:
    for role, headers in _tokens(client).items():
        answer = client.get("/v1/nodes/", headers=headers)
        assert answer.status_code == 404, (role, answer.text)
        assert answer.json()["error"]["detail"]["route"] == "/v1/nodes"


def test_a_route_asked_with_another_method_is_405_with_allow(client: TestClient) -> None:
    for role, headers in _tokens(client).items():
        for method, path, allow in (
            ("GET", "/v1/place", "POST"),
            ("DELETE", "/v1/place", "POST"),
            ("POST", "/v1/nodes/n1", "DELETE, GET, HEAD"),
            ("PATCH", "/v1/nodes/n1/key", "DELETE, GET, HEAD, PUT"),
        ):
            answer = client.request(method, path, headers=headers)
            assert answer.status_code == 405, (role, method, path, answer.text)
            assert answer.json()["error"]["code"] == "method_not_allowed"
            assert answer.headers["allow"] == allow


def test_an_unknown_path_is_404_for_every_role(client: TestClient) -> None:
    for role, headers in _tokens(client).items():
        answer = client.post("/v1/nope", json={}, headers=headers)
        assert answer.status_code == 404, (role, answer.text)
        assert answer.json()["error"]["message"].startswith("no such route")


def test_without_a_token_it_is_still_401(client: TestClient) -> None:
    answer = client.post("/v1/place/", json={"gpus": 1}, headers={"Authorization": ""})
    assert answer.status_code == 401, answer.text


def test_a_route_the_table_has_no_rule_for_stays_an_admins(settings: Settings) -> None:
    """The table's closed default holds: a route added without a rule is no 404."""
    app = create_app(secured(settings), background=False)

    @app.post("/v1/unruled")
    def unruled() -> dict[str, str]:
        return {"ok": "yes"}

    with TestClient(app, headers=ADMIN) as admin:
        scheduler = _tokens(admin)["scheduler"]
        refused = admin.post("/v1/unruled", headers=scheduler)
        assert refused.status_code == 403, refused.text
        assert "needs the admin role" in refused.json()["error"]["message"]
        assert admin.post("/v1/unruled").json() == {"ok": "yes"}
