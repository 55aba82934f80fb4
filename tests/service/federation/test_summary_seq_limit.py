"""A summary's seq is the region's clock in nanoseconds: one far ahead of the global
service's clock is refused, so that no region can store a seq that no later push can pass
(the largest a seq can be is 2^63-1), and a region stuck at it pushes again."""

from __future__ import annotations

import time
from typing import Any

import orjson
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.schema import regions
from tests.service.conftest import FakeClock
from tests.service.federation.test_regions_api import bearer, register, signed, summary

URL = "/v1/regions/aws-east/summary"
SEQ_MAX = 2**63 - 1
HOUR_NS = 3600 * 10**9


def _push(client: TestClient, token: str, seq: int) -> Any:
    body = summary()
    body["seq"] = seq
    return client.put(URL, json=signed(body), headers=bearer(token))


def _stored_seq(client: TestClient) -> int | None:
    shown = client.get("/v1/regions/aws-east").json()["summary"]
    return None if shown is None else int(shown["seq"])


def test_a_seq_far_ahead_of_the_clock_is_refused_naming_the_limit(client: TestClient) -> None:
    token = register(client)
    for seq in (SEQ_MAX, time.time_ns() + 25 * HOUR_NS):
        refused = _push(client, token, seq)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["code"] == "seq_ahead"
        assert error["detail"]["field"] == "summary.seq" and error["detail"]["max_seq"] == SEQ_MAX
        assert str(SEQ_MAX) in error["message"] and "clock" in error["message"]
    assert _stored_seq(client) is None  # nothing was stored: the region is not locked out
    first = _push(client, token, time.time_ns())
    assert first.status_code == 200, first.text
    assert _push(client, token, time.time_ns()).status_code == 200


def test_a_seq_a_little_ahead_is_taken_and_the_region_counts_on_from_it(
    client: TestClient,
) -> None:
    """A region whose clock ran an hour fast, then was set right: its next push is a
    replay naming the stored seq, and the one after it (the stored seq + 1) is taken."""
    token = register(client)
    ahead = time.time_ns() + HOUR_NS
    assert _push(client, token, ahead).status_code == 200
    replayed = _push(client, token, time.time_ns())
    assert replayed.status_code == 409
    assert replayed.json()["error"]["detail"]["stored_seq"] == ahead
    assert _push(client, token, ahead + 1).status_code == 200


def test_a_seq_past_the_largest_storable_is_refused_naming_it(client: TestClient) -> None:
    token = register(client)
    refused = _push(client, token, SEQ_MAX + 1)
    assert refused.status_code == 422
    assert str(SEQ_MAX) in refused.json()["error"]["message"]


def test_a_region_stuck_at_the_largest_seq_pushes_again(
    client: TestClient, clock: FakeClock
) -> None:
    """A seq at the limit stored before it was checked (or by a global service whose
    clock was set back since): it binds no later push."""
    token = register(client)
    engine: sa.Engine = client.app.state.service.engine  # type: ignore[attr-defined]
    with engine.begin() as conn:
        conn.execute(
            regions.update()
            .where(regions.c.name == "aws-east")
            .values(
                summary=orjson.dumps({**summary(), "seq": SEQ_MAX}).decode(),
                summary_seq=SEQ_MAX,
                summary_at=clock(),
            )
        )
    assert _fits_eight(client)  # the stuck summary: 8 free GPUs
    now = time.time_ns()
    full = summary(free=0)
    full["seq"] = now
    taken = client.put(URL, json=signed(full), headers=bearer(token))
    assert taken.status_code == 200, taken.text
    assert _stored_seq(client) == now
    assert not _fits_eight(client)  # routed by the summary taken, not the stuck one
    assert _push(client, token, now).status_code == 409  # and replays are refused again


def _fits_eight(client: TestClient) -> bool:
    candidates = client.post("/v1/federation/score", json={"gpus": 8}).json()["candidates"]
    return bool(candidates[0]["fits"])
