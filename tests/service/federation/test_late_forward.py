"""No forward leaves after the request's deadline: its hold on the key ends there.

A keyed request holds its key's row until ``deadline_s`` + 10 s; past that,
a retry takes the row as one whose holder died. The deadline was checked
before each region's database reads, not after them: a request whose read
of its region's URL stalled past its hold forwarded anyway, to the region
it had pinned. A retry had meanwhile taken the row, been refused there and
moved the key on and placed it elsewhere; the stalled request's late
forward was then placed too: one key, two allocations.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.federation import store
from tests.service.conftest import FakeClock
from tests.service.federation.fake_regions import Regions, allocation, answering

KEYED = {"Idempotency-Key": "k-late-read"}
BODY = {"gpus": 2, "federation": {"deadline_s": 0.5}}


def no_answer(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def refuse(request: httpx.Request) -> httpx.Response:
    error = {"code": "unschedulable", "message": "nothing fits now", "detail": {}}
    return httpx.Response(409, json={"error": error})


def test_a_request_whose_read_outlived_its_hold_forwards_nothing(
    client: TestClient, regions: Regions, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    regions.answers["cheap"] = no_answer
    assert client.post("/v1/federation/place", json=BODY, headers=KEYED).status_code == 503
    regions.answers["cheap"] = refuse  # what the retry finds there: the key moves on
    regions.answers["mid"] = answering("mid")
    stalled, retried = threading.Event(), threading.Event()
    forward_target = store.forward_target

    def slow_forward_target(*args: Any) -> tuple[str, str | None] | None:
        if not stalled.is_set():  # the first request's read: past its deadline and hold
            stalled.set()
            clock.advance(20)  # past its hold (0.5 + 10 s), within staleness
            assert retried.wait(10)
            time.sleep(0.6)
        return forward_target(*args)

    monkeypatch.setattr(store, "forward_target", slow_forward_target)
    answers: dict[str, httpx.Response] = {}

    def first() -> None:
        answers["first"] = client.post("/v1/federation/place", json=BODY, headers=KEYED)

    thread = threading.Thread(target=first)
    thread.start()
    assert stalled.wait(10)
    retry = client.post("/v1/federation/place", json=BODY, headers=KEYED)
    assert retry.status_code == 201 and retry.json()["region"] == "mid", retry.text
    regions.answers["cheap"] = lambda request: allocation("cheap")  # room there again
    retried.set()
    thread.join(10)
    late = answers["first"]
    assert late.status_code == 503, late.text
    assert late.json()["error"]["code"] == "region_unavailable"
    sent = [r for r, key, _ in regions.seen if key == KEYED["Idempotency-Key"]]
    assert sent == ["cheap", "cheap", "mid"], "a forward left after its deadline"
