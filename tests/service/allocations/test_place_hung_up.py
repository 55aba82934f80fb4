"""A REST /place without an Idempotency-Key whose client hung up before its answer keeps
no reservation: the client cannot learn it, and its retry would reserve a second one."""

from __future__ import annotations

from fastapi.testclient import TestClient

from placement.profiles import build_profile
from tests.service.conftest import ADMIN_TOKEN
from tests.service.helpers import report
from tests.service.raw_asgi import raw_post


def _place_then_hang_up(rest: TestClient, body: dict[str, object], key: str | None) -> None:
    """The request as uvicorn hands it over from a client gone before the answer: the
    body, then the disconnect."""
    headers = [(b"authorization", f"Bearer {ADMIN_TOKEN}".encode())]
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    raw_post(rest, "/v1/place", body, headers)


def _states(client: TestClient, job_id: str) -> list[str]:
    listed = client.get("/v1/allocations", params={"job_id": job_id}).json()["allocations"]
    return [a["state"] for a in listed]


def test_a_keyless_place_whose_client_hung_up_keeps_nothing(client: TestClient) -> None:
    report(client, build_profile("hgx-h100", "h0"))
    _place_then_hang_up(client, {"gpus": 2, "job_id": "gone"}, None)
    assert _states(client, "gone") == ["released"]
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 8


def test_a_keyed_place_whose_client_hung_up_is_kept_for_its_retry(client: TestClient) -> None:
    report(client, build_profile("hgx-h100", "h0"))
    _place_then_hang_up(client, {"gpus": 2, "job_id": "keyed"}, "k-1")
    assert _states(client, "keyed") == ["pending"]
    retry = client.post(
        "/v1/place", json={"gpus": 2, "job_id": "keyed"}, headers={"Idempotency-Key": "k-1"}
    )
    assert retry.status_code == 200, retry.text
    assert _states(client, "keyed") == ["pending"]


def test_an_answered_place_is_kept(client: TestClient) -> None:
    report(client, build_profile("hgx-h100", "h0"))
    assert client.post("/v1/place", json={"gpus": 2, "job_id": "kept"}).status_code == 201
    assert _states(client, "kept") == ["pending"]
