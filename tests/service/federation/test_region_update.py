"""Setting a registered region's URL and forward token again (PATCH /v1/regions/{region}).

A region registered with a wrong URL answered every keyed retry with 503 until it
was retired; an admin now sets the URL right, checked as registration checks it
(the forwards that follow: test_routing.py).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.federation import store
from service.schema import regions
from tests.service.federation.test_regions_api import bearer, register
from tests.service.federation.test_routing import BAD_URLS


def _region(client: TestClient, name: str) -> dict[str, Any]:
    shown = client.get(f"/v1/regions/{name}")
    assert shown.status_code == 200, shown.text
    region: dict[str, Any] = shown.json()
    return region


def _forward_to(client: TestClient) -> tuple[str, str | None]:
    app: Any = client.app
    target = store.forward_target(app.state.federation.engine, "aws-east")
    assert target is not None
    return target


def _admin_rows(client: TestClient) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = client.get("/v1/audit", params={"kind": "admin"}).json()[
        "entries"
    ]
    return entries


def test_an_admin_sets_the_url_and_forward_token_and_it_is_audited(client: TestClient) -> None:
    register(client)
    answer = client.patch(
        "/v1/regions/aws-east",
        json={"url": "https://topoplace.use1.example/", "forward_token": "tpp_new_secret"},
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["url"] == "https://topoplace.use1.example"
    assert "forward_token" not in answer.json()
    assert _region(client, "aws-east")["url"] == "https://topoplace.use1.example"
    assert _forward_to(client) == ("https://topoplace.use1.example", "tpp_new_secret")
    row = _admin_rows(client)[0]
    assert row["action"] == "region_updated" and row["route"] == "PATCH /v1/regions/{region}"
    assert row["actor"]["role"] == "admin"
    assert row["detail"] == {
        "region": "aws-east",
        "changed": ["forward_token", "url"],
        "url": "https://topoplace.use1.example",
        "previous_url": "https://topoplace.aws-east.example:8443",
    }
    assert "tpp_new_secret" not in str(row)  # the token is a secret, never shown

    cleared = client.patch("/v1/regions/aws-east", json={"forward_token": None})
    assert cleared.status_code == 200, cleared.text
    assert _forward_to(client) == ("https://topoplace.use1.example", None)
    assert _admin_rows(client)[0]["detail"]["changed"] == ["forward_token"]
    same = client.patch("/v1/regions/aws-east", json={"url": "https://topoplace.use1.example"})
    assert same.status_code == 200 and len(_admin_rows(client)) == 4  # no change, no row


@pytest.mark.parametrize("url", ["ftp://host", "localhost:8080", None, *BAD_URLS])
def test_a_bad_url_is_refused_and_nothing_changes(client: TestClient, url: str | None) -> None:
    register(client)
    before = _region(client, "aws-east")
    answer = client.patch("/v1/regions/aws-east", json={"url": url})
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and "url" in error["message"]
    assert _region(client, "aws-east") == before
    assert [r["action"] for r in _admin_rows(client)] == ["region_registered", "token_created"]


@pytest.mark.parametrize("body", [{}, {"name": "other"}, {"public_key": "AAAA"}])
def test_nothing_to_set_or_a_field_not_settable_is_refused(
    client: TestClient, body: dict[str, Any]
) -> None:
    register(client)
    answer = client.patch("/v1/regions/aws-east", json=body)
    assert answer.status_code == 422 and answer.json()["error"]["code"] == "invalid_request"


def test_only_an_admin_updates(client: TestClient) -> None:
    region_token = register(client)
    before = _region(client, "aws-east")
    for role in ("scheduler", "viewer"):
        token = client.post("/v1/tokens", json={"role": role}).json()["token"]
        refused = client.patch(
            "/v1/regions/aws-east", json={"url": "https://evil.example"}, headers=bearer(token)
        )
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    # Not even the region itself: its token pushes its summary and nothing else.
    refused = client.patch(
        "/v1/regions/aws-east", json={"url": "https://evil.example"}, headers=bearer(region_token)
    )
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert _region(client, "aws-east") == before
    assert not [r for r in _admin_rows(client) if r["action"] == "region_updated"]


def test_an_unknown_or_retired_region_is_refused(client: TestClient) -> None:
    unknown = client.patch("/v1/regions/nowhere", json={"url": "https://x.example"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "not_found"
    register(client)
    assert client.post("/v1/regions/aws-east/retire").status_code == 200
    retired = client.patch("/v1/regions/aws-east", json={"url": "https://x.example"})
    assert retired.status_code == 409 and retired.json()["error"]["code"] == "region_retired"
    assert _region(client, "aws-east")["url"] == "https://topoplace.aws-east.example:8443"


def test_an_update_waits_for_a_retirement_under_way_and_is_refused(client: TestClient) -> None:
    """The row is locked from the update's read: a retirement committing meanwhile is
    seen (409), not written over (was: the URL set on a retired region, answered 200)."""
    register(client)
    app: Any = client.app
    engine = app.state.federation.engine
    if engine.dialect.name != "postgresql":
        pytest.skip("SQLite has no row locks: one writer at a time")
    answers: list[int] = []
    with engine.begin() as conn:  # a retirement on another replica, not yet committed
        conn.execute(
            regions.update()
            .where(regions.c.name == "aws-east")
            .values(retired_at=datetime.now(UTC))
        )
        worker = threading.Thread(
            target=lambda: answers.append(
                client.patch("/v1/regions/aws-east", json={"url": "https://x.example"}).status_code
            )
        )
        worker.start()
        worker.join(1.0)
        assert worker.is_alive(), "the update did not wait for the retirement's row lock"
    worker.join(10)
    assert answers == [409]
    assert _region(client, "aws-east")["url"] == "https://topoplace.aws-east.example:8443"
