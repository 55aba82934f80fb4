"""A key's kept request is compared as the fields it asks for, not as text.

``federation_forwards.request`` keeps the request a key was sent for
(migration 0016), so that a key reused for another job is refused. It was
compared as text: a row written before the request gained a field (the very
next revision added ``cpu_milli`` and ``memory_mib``) never matched its own
retry after the upgrade, which was told the key was used for a different
request and to use a new key, and a new key is placed afresh: a second
allocation while the first, made in the key's region, is still held there.
A field at its default means what leaving it out means, as the regions'
own replays compare (service/allocations/stored_request.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.federation import store
from service.federation.forward_request import request_text, same_request
from service.federation.schemas import FederatedPlaceRequest
from tests.service.federation.fake_regions import Regions, answering

ASKED: dict[str, Any] = {"gpus": 2, "federation": {"hours": 2}}


def kept_before(client: TestClient, key: str, drop: tuple[str, ...], region: str) -> None:
    """``key`` forwarded to ``region`` by a revision whose request had no ``drop`` fields."""
    written = json.loads(request_text(FederatedPlaceRequest.model_validate(ASKED)))
    for name in drop:
        written.pop(name)
    old_text = json.dumps(written, sort_keys=True, separators=(",", ":"))
    app: Any = client.app
    engine = app.state.federation.engine
    now = datetime.now(UTC)
    assert store.hold_key(engine, key, region, "H100", "old", now, now, old_text)
    store.let_go_key(engine, key, "old")


@pytest.mark.parametrize("drop", [("cpu_milli", "memory_mib"), ("cpu_milli",)])
def test_a_key_kept_before_the_request_gained_fields_is_its_own_retry(
    client: TestClient, regions: Regions, drop: tuple[str, ...]
) -> None:
    kept_before(client, "k-upgrade", drop, "mid")
    regions.answers["mid"] = answering("mid", replayed=True)
    again = client.post(
        "/v1/federation/place", json=ASKED, headers={"Idempotency-Key": "k-upgrade"}
    )
    assert again.status_code == 200, again.text
    assert again.json()["region"] == "mid" and again.json()["replayed"] is True
    assert [r for r, key, _ in regions.seen if key == "k-upgrade"] == ["mid"]


def test_a_key_kept_before_is_still_refused_for_another_request(
    client: TestClient, regions: Regions
) -> None:
    kept_before(client, "k-other-job", ("cpu_milli", "memory_mib"), "mid")
    other = {**ASKED, "cpu_milli": 500}
    again = client.post(
        "/v1/federation/place", json=other, headers={"Idempotency-Key": "k-other-job"}
    )
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "conflict"
    assert regions.seen == []


def text(body: dict[str, Any]) -> str:
    return request_text(FederatedPlaceRequest.model_validate(body))


def test_fields_at_their_defaults_are_the_fields_left_out() -> None:
    kept = json.loads(text({"gpus": 2, "federation": {"floor": {"island": 8}}}))
    del kept["federation"]["floor"]["gbps"]  # a nested field the request gained since
    del kept["numa"]
    old = json.dumps(kept, sort_keys=True)
    assert same_request(old, text({"gpus": 2, "federation": {"floor": {"island": 8}}}))
    assert not same_request(old, text({"gpus": 2, "federation": {"floor": {"island": 4}}}))
    assert not same_request(old, text({"gpus": 2}))
    assert not same_request(
        old, text({"gpus": 2, "numa": "required", "federation": {"floor": {"island": 8}}})
    )
    assert not same_request("not json", text({"gpus": 2}))
