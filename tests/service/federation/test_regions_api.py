"""Registering regions, their signed summaries, retiring them: the global service's API."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi import Request
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from service.federation import endpoints
from service.federation.registry import Registry
from service.federation.schemas import RegionSummary
from service.federation.signing import sign_summary
from service.tokens import store as token_store
from tests.service.conftest import FakeClock

KEY = NodeKey.generate()


def registration(name: str = "aws-east", **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "cloud": "aws",
        "location": "us-east-1",
        "url": "https://topoplace.aws-east.example:8443/",
        "public_key": KEY.public_key,
        "prices": [{"gpu_model": "H100", "on_demand": 4.0, "spot": 1.5}],
        "egress": {"region_gb": 0.02, "internet_gb": 0.09},
        "labels": {"interconnect": "efa"},
    }
    body.update(changes)
    return body


def summary(region: str = "aws-east", free: int = 8, **changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "region": region,
        "seq": time.time_ns(),
        "sent_at": datetime.now(UTC).isoformat(),
        "designs": [
            {
                "design": "NVIDIA H100 80GB HBM3 x8 nvl[8]",
                "gpu_model": "NVIDIA H100 80GB HBM3",
                "gpus_per_node": 8,
                "nodes": 1,
                "free_gpus": free,
                "island_gbps": 450.0,
                "by_island": {str(free): 1} if free else {},
            }
        ],
        "live_allocations": 0,
    }
    body.update(changes)
    return RegionSummary.model_validate(body).model_dump(mode="json")


def signed(body: dict[str, Any], key: NodeKey = KEY) -> dict[str, Any]:
    return {"summary": body, "signature": sign_summary(key, body)}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def register(client: TestClient, name: str = "aws-east") -> str:
    created = client.post("/v1/regions", json=registration(name))
    assert created.status_code == 201, created.text
    token: str = created.json()["token"]
    return token


def test_a_region_registers_and_gets_a_region_token(client: TestClient) -> None:
    created = client.post("/v1/regions", json=registration())
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["url"] == "https://topoplace.aws-east.example:8443"
    assert body["summary"] is None and body["retired_at"] is None
    tokens = client.get("/v1/tokens").json()["tokens"]
    token = next(t for t in tokens if t["id"] == body["token_id"])
    assert token["role"] == "region" and token["region"] == "aws-east"
    listed = client.get("/v1/regions").json()["regions"]
    assert [r["name"] for r in listed] == ["aws-east"]
    assert "token" not in listed[0] and "forward_token" not in listed[0]
    assert client.get("/v1/regions/aws-east").json()["labels"] == {"interconnect": "efa"}
    assert client.get("/v1/regions/nowhere").json()["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"name": "AWS East"}, "name"),
        ({"url": "ftp://host"}, "url"),
        ({"url": "http://"}, "url"),
        ({"url": "localhost:8080"}, "url"),
        ({"url": "http://topoplace example"}, "url"),
        ({"url": " https://topoplace.example"}, "url"),
        ({"url": "https://admin:secret@topoplace.example"}, "url"),
        ({"url": "https://topoplace.example:99999"}, "url"),
        ({"url": "https://topoplace.example/?via=proxy"}, "url"),
        ({"url": "https://xn--a.example"}, "url"),
        ({"public_key": "not-a-key"}, "public_key"),
        ({"public_key": "AAAA"}, "public_key"),
        ({"prices": []}, "prices"),
        ({"prices": [{"gpu_model": "H100", "on_demand": -1}]}, "prices"),
        (
            {
                "prices": [
                    {"gpu_model": "H100", "on_demand": 1},
                    {"gpu_model": "h100", "on_demand": 2},
                ]
            },
            "prices",
        ),
        ({"egress": {"region_gb": 0.01}}, "egress"),
        ({"cloud": ""}, "cloud"),
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_registrations_are_refused_and_nothing_is_written(
    client: TestClient, changes: dict[str, Any], field: str
) -> None:
    answer = client.post("/v1/regions", json=registration(**changes))
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["code"] == "invalid_request"
    assert field in error["message"]
    assert client.get("/v1/regions").json()["regions"] == []
    assert [t for t in client.get("/v1/tokens").json()["tokens"] if t["role"] == "region"] == []


def test_a_name_is_registered_once(client: TestClient) -> None:
    register(client)
    again = client.post("/v1/regions", json=registration())
    assert again.status_code == 409 and again.json()["error"]["code"] == "conflict"


def test_only_an_admin_registers(client: TestClient) -> None:
    scheduler = client.post("/v1/tokens", json={"role": "scheduler"}).json()["token"]
    refused = client.post("/v1/regions", json=registration(), headers=bearer(scheduler))
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert client.get("/v1/regions", headers=bearer(scheduler)).status_code == 200


def test_a_signed_summary_is_taken_once(client: TestClient) -> None:
    token = register(client)
    body = summary()
    pushed = client.put("/v1/regions/aws-east/summary", json=signed(body), headers=bearer(token))
    assert pushed.status_code == 200, pushed.text
    shown = client.get("/v1/regions/aws-east").json()["summary"]
    assert shown["free_gpus"] == 8 and shown["seq"] == body["seq"] and not shown["stale"]
    replay = client.put("/v1/regions/aws-east/summary", json=signed(body), headers=bearer(token))
    assert replay.status_code == 409 and replay.json()["error"]["code"] == "replayed_summary"


def test_a_summary_not_signed_by_the_region_is_refused(client: TestClient) -> None:
    token = register(client)
    forged = signed(summary(free=0), NodeKey.generate())
    answer = client.put("/v1/regions/aws-east/summary", json=forged, headers=bearer(token))
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "bad_signature"
    tampered = signed(summary())
    tampered["summary"]["designs"][0]["free_gpus"] = 0
    answer = client.put("/v1/regions/aws-east/summary", json=tampered, headers=bearer(token))
    assert answer.status_code == 403 and answer.json()["error"]["code"] == "bad_signature"
    assert client.get("/v1/regions/aws-east").json()["summary"] is None


def test_a_region_token_pushes_its_own_summary_and_nothing_else(client: TestClient) -> None:
    token = register(client)
    register(client, "gcp-central")
    other = client.put(
        "/v1/regions/gcp-central/summary",
        json=signed(summary("gcp-central")),
        headers=bearer(token),
    )
    assert other.status_code == 403 and other.json()["error"]["code"] == "forbidden"
    for method, path in (
        ("GET", "/v1/regions"),
        ("POST", "/v1/federation/place"),
        ("GET", "/v1/nodes"),
    ):
        answer = client.request(method, path, json={}, headers=bearer(token))
        assert answer.status_code == 403, (method, path)
    mismatch = client.put(
        "/v1/regions/aws-east/summary", json=signed(summary("gcp-central")), headers=bearer(token)
    )
    assert mismatch.status_code == 422 and "summary.region" in mismatch.json()["error"]["message"]


def test_a_silent_region_turns_stale_and_is_skipped(client: TestClient, clock: FakeClock) -> None:
    token = register(client)
    client.put("/v1/regions/aws-east/summary", json=signed(summary()), headers=bearer(token))
    scored = client.post("/v1/federation/score", json={"gpus": 8}).json()["candidates"]
    assert scored[0]["fits"] and scored[0]["cost"]["total"] == 32.0
    clock.advance(31)  # TOPOPLACE_FEDERATION_STALE_S is 30 by default
    assert client.get("/v1/regions/aws-east").json()["summary"]["stale"] is True
    scored = client.post("/v1/federation/score", json={"gpus": 8}).json()["candidates"]
    assert scored[0]["stale"] and not scored[0]["fits"]
    refused = client.post("/v1/federation/place", json={"gpus": 8})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "no_region"
    assert "stale" in refused.json()["error"]["detail"]["alternatives"][0]["reason"]
    # Back on the next push.
    client.put("/v1/regions/aws-east/summary", json=signed(summary()), headers=bearer(token))
    assert client.post("/v1/federation/score", json={"gpus": 8}).json()["candidates"][0]["fits"]


def test_retiring_a_busy_region_needs_force(client: TestClient) -> None:
    token = register(client)
    busy = signed(summary(live_allocations=3))
    client.put("/v1/regions/aws-east/summary", json=busy, headers=bearer(token))
    refused = client.post("/v1/regions/aws-east/retire")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "region_busy"
    assert client.get("/v1/regions/aws-east").json()["retired_at"] is None
    retired = client.post("/v1/regions/aws-east/retire?force=true")
    assert retired.status_code == 200 and retired.json()["retired_at"] is not None
    assert client.get("/v1/regions").json()["regions"] == []
    assert [r["name"] for r in client.get("/v1/regions?retired=true").json()["regions"]] == [
        "aws-east"
    ]
    again = client.put(
        "/v1/regions/aws-east/summary", json=signed(summary()), headers=bearer(token)
    )
    assert again.status_code == 401  # its token is revoked with it
    by_admin = client.put("/v1/regions/aws-east/summary", json=signed(summary()))
    assert by_admin.status_code == 409 and by_admin.json()["error"]["code"] == "region_retired"
    assert client.post("/v1/regions", json=registration()).status_code == 409


def test_an_idle_region_retires_without_force(client: TestClient) -> None:
    register(client)
    assert client.post("/v1/regions/aws-east/retire").status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"federation": {"data": {"region": "nowhere", "size_gb": 10}}}, "federation.data.region"),
        ({"federation": {"regions": ["nowhere"]}}, "federation.regions"),
        ({"mig_profile": "1g.10gb"}, "whole GPUs"),
        ({"federation": {"cost_weight": 2}}, "cost_weight"),
        ({"federation": {"hours": 0}}, "hours"),
    ],
)
def test_bad_federated_requests_are_refused(
    client: TestClient, body: dict[str, Any], field: str
) -> None:
    register(client)
    answer = client.post("/v1/federation/place", json=body)
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["error"]["message"]


def test_a_summary_of_too_many_gpu_models_is_refused(client: TestClient) -> None:
    """Each GPU model a summary names is matched against each model a job asks for, on
    every request: a region naming 1,000 models made each request with 64 of them
    match 64,000 pairs on the event loop. A summary names at most 64 models."""
    token = register(client)
    designs = [
        {
            "design": f"GPU{i} x8",
            "gpu_model": f"NVIDIA GPU{i}",
            "gpus_per_node": 8,
            "nodes": 1,
            "free_gpus": 8,
            "island_gbps": 450.0,
            "by_island": {"8": 1},
        }
        for i in range(65)
    ]
    body = {**summary(), "designs": designs}
    answer = client.put("/v1/regions/aws-east/summary", json=signed(body), headers=bearer(token))
    assert answer.status_code == 422, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == "summary.designs"
    assert "64" in error["message"], error["message"]
    assert client.get("/v1/regions/aws-east").json()["summary"] is None
    within = {**summary(), "designs": designs[:64]}
    taken = client.put("/v1/regions/aws-east/summary", json=signed(within), headers=bearer(token))
    assert taken.status_code == 200, taken.text[:300]


@pytest.mark.parametrize("size", ["\u0663", "\u00b2", "\uff18", "08", "65", "-8", " 8", ""])
def test_an_island_size_that_is_not_a_plain_number_is_refused(
    client: TestClient, size: str
) -> None:
    """An island size is a key of text, read back as an int: "\u0663" (Arabic-Indic three)
    passed str.isdigit() and was stored as a key no producer writes, and "08" was read
    back as the same size as "8", one count overwriting the other. Only the ASCII
    decimal spelling of a size from 0 to 64 is taken."""
    token = register(client)
    body = summary()
    body["designs"][0]["by_island"] = {size: 1}
    answer = client.put("/v1/regions/aws-east/summary", json=signed(body), headers=bearer(token))
    assert answer.status_code == 422, answer.text[:300]
    error = answer.json()["error"]
    assert error["code"] == "invalid_request", error
    assert error["detail"]["field"] == "summary.designs.0.by_island", error
    assert client.get("/v1/regions/aws-east").json()["summary"] is None


def _revoked_as_it_waits(client: TestClient, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A database admin token whose revocation lands (the database, then this process's
    poll) after its next call was let in, before its route writes: where a call waits
    for a worker thread under load."""
    made = client.post("/v1/tokens", json={"role": "admin", "name": "ops"})
    assert made.status_code == 201, made.text
    _revoke_before_the_write(monkeypatch, made.json()["id"])
    return {"Authorization": f"Bearer {made.json()['token']}"}


def _revoke_before_the_write(monkeypatch: pytest.MonkeyPatch, token_id: str) -> None:
    """The token is revoked (the database, then this process's poll) as the route reads
    its registry: after the call was let in, before it writes."""
    registry_of = endpoints._registry

    def revoking(request: Request) -> Registry:
        registry = registry_of(request)
        token_store.revoke(registry.engine, token_id)
        request.app.state.token_check.forget_revoked()
        return registry

    monkeypatch.setattr(endpoints, "_registry", revoking)


def test_an_admin_token_revoked_while_its_call_waited_registers_no_region(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Registering mints a region token: none for a revoked admin token."""
    headers = _revoked_as_it_waits(client, monkeypatch)
    made = client.post("/v1/regions", json=registration(), headers=headers)
    assert made.status_code == 401, made.text
    assert client.get("/v1/regions/aws-east").status_code == 404


def test_an_admin_token_revoked_while_its_call_waited_moves_no_region(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An update points the region's forwards, and its forward token, at another URL;
    retiring stops routing to it and revokes its token."""
    assert client.post("/v1/regions", json=registration()).status_code == 201
    headers = _revoked_as_it_waits(client, monkeypatch)
    moved = client.patch(
        "/v1/regions/aws-east", json={"url": "https://elsewhere.example"}, headers=headers
    )
    assert moved.status_code == 401, moved.text
    retired = client.post("/v1/regions/aws-east/retire", headers=headers)
    assert retired.status_code == 401, retired.text
    region = client.get("/v1/regions/aws-east").json()
    assert region["url"] == registration()["url"].rstrip("/") and region["retired_at"] is None


def test_a_region_token_revoked_while_its_push_waited_stores_no_summary(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin who revokes a region's token (leaked; its region kept) stops its pushes: one
    that was let in before and waited for a worker thread is not stored either."""
    token = register(client)
    _revoke_before_the_write(monkeypatch, client.get("/v1/regions/aws-east").json()["token_id"])
    pushed = client.put(
        "/v1/regions/aws-east/summary", json=signed(summary()), headers=bearer(token)
    )
    assert pushed.status_code == 401, pushed.text
    assert client.get("/v1/regions/aws-east").json()["summary"] is None
