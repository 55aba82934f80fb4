"""An Idempotency-Key is forwarded as the caller sent it, byte for byte.

HTTP header values are bytes; the service reads them as Latin-1, as every
route does, so a key with a byte past ASCII (``k-\\xe9t\\xe9``) is a key to
``/v1/place``. The forward's client encoded header values as ASCII: such a
key raised out of routing, a 500 after its row had been pointed at a region
nothing was sent to, and every retry of it the same 500.
"""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient

from tests.service.federation.fake_regions import Regions, answering

KEY_BYTES = b"k-\xe9t\xe9"


def keyed(client: TestClient) -> httpx.Response:
    answer: httpx.Response = client.post(
        "/v1/federation/place", json={"gpus": 2}, headers=[(b"idempotency-key", KEY_BYTES)]
    )
    return answer


def test_a_key_past_ascii_is_forwarded_as_sent(client: TestClient, regions: Regions) -> None:
    first = keyed(client)
    assert first.status_code == 201, first.text
    assert first.json()["region"] == "cheap"
    regions.answers["cheap"] = answering("cheap", replayed=True)
    again = keyed(client)
    assert again.status_code == 200, again.text
    assert again.json()["region"] == "cheap" and again.json()["replayed"] is True
    sent = KEY_BYTES.decode("latin-1")  # what the region reads, as the global service did
    assert [(r, key) for r, key, _ in regions.seen] == [("cheap", sent), ("cheap", sent)]
