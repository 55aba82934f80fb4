"""Forwarding and failing over, with regions whose answers the test chooses.

The global service is real (its API, database and ranking); the regions
behind it are an httpx transport that answers, refuses, hangs up or never
answers, so each outcome of docs/federation.md's forwarding rules is tried.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.federation import ranking, routing, store, summary_limits
from service.federation import registry as registry_module
from service.federation.schemas import MAX_GPU_MODEL_NAME, FederatedPlaceRequest
from service.schema import regions as regions_table
from service.settings import Settings
from service.tokens import store as token_store
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.federation.fake_regions import (
    PRICES,
    Answer,
    Regions,
    add_region,
    allocation,
    answering,
)


def refuse(request: httpx.Request) -> httpx.Response:
    error = {"code": "unschedulable", "message": "nothing fits now", "detail": {}}
    return httpx.Response(409, json={"error": error})


def hang_up(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def no_answer(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def place(client: TestClient, key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    answer: httpx.Response = client.post("/v1/federation/place", json={"gpus": 2}, headers=headers)
    return answer


def test_the_forward_is_the_callers_request_with_the_priced_model(
    client: TestClient, regions: Regions
) -> None:
    answer = client.post(
        "/v1/federation/place",
        json={"gpus": 2, "job_id": "j1", "ttl_s": 30.0, "federation": {"hours": 2}},
        headers={"Idempotency-Key": "k-1"},
    )
    assert answer.status_code == 201, answer.text
    ((region, key, body),) = regions.seen
    assert region == "cheap" and key == "k-1"
    assert body == {"gpus": 2, "job_id": "j1", "ttl_s": 30.0, "gpu_models": ["H100"]}
    placed = answer.json()
    assert placed["node"] == "cheap-n1" and placed["gpus"] == ["GPU-0", "GPU-1"]
    assert placed["cost"]["compute"] == 4.0 and placed["timings_ms"]["routing"] >= 0


def test_refused_and_unreachable_regions_are_skipped(client: TestClient, regions: Regions) -> None:
    regions.answers["cheap"] = refuse
    regions.answers["mid"] = hang_up
    answer = place(client)
    assert answer.status_code == 201, answer.text
    body = answer.json()
    assert body["region"] == "dear"
    assert [(a["region"], a["outcome"]) for a in body["attempts"]] == [
        ("cheap", "refused"),
        ("mid", "unreachable"),
        ("dear", "placed"),
    ]


def test_every_region_refusing_is_no_region(client: TestClient, regions: Regions) -> None:
    for name in PRICES:
        regions.answers[name] = refuse
    answer = place(client)
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "no_region" and len(error["detail"]["attempts"]) == 3


def test_without_a_key_an_unanswered_region_is_skipped(
    client: TestClient, regions: Regions
) -> None:
    regions.answers["cheap"] = no_answer
    body = place(client).json()
    assert body["region"] == "mid" and body["attempts"][0]["outcome"] == "unanswered"


def test_with_a_key_an_unanswered_region_keeps_the_key(
    client: TestClient, regions: Regions
) -> None:
    regions.answers["cheap"] = no_answer
    answer = place(client, "k-2")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "region_unavailable"
    assert [r for r, _, _ in regions.seen] == ["cheap"]  # not sent anywhere else
    # The region did reserve; its answer comes on the retry, from the same region.
    regions.answers["cheap"] = answering("cheap", replayed=True)
    again = place(client, "k-2")
    # A replay is answered as /v1/place answers one: 200 and the header, not "created".
    assert again.status_code == 200 and again.json()["region"] == "cheap"
    assert again.json()["replayed"] is True
    assert again.headers["Idempotent-Replayed"] == "true"


def test_a_refusal_moves_the_key_to_the_next_region(client: TestClient, regions: Regions) -> None:
    regions.answers["cheap"] = refuse
    first = place(client, "k-3").json()
    assert first["region"] == "mid"
    # The cheap region could take it now, but the key stays where its allocation is.
    regions.answers["cheap"] = answering("cheap")
    regions.answers["mid"] = answering("mid", replayed=True)
    again = place(client, "k-3").json()
    assert again["region"] == "mid" and again["replayed"] is True
    assert [r for r, key, _ in regions.seen if key == "k-3"] == ["cheap", "mid", "mid"]
    assert regions.seen[1][2] == regions.seen[2][2]  # the same request, replayed as such


def test_a_keyed_region_that_is_down_is_not_replaced(client: TestClient, regions: Regions) -> None:
    assert place(client, "k-4").json()["region"] == "cheap"
    regions.answers["cheap"] = hang_up
    answer = place(client, "k-4")
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "region_unavailable"
    assert [r for r, key, _ in regions.seen if key == "k-4"] == ["cheap", "cheap"]


def test_a_keyed_region_that_refuses_frees_the_key(client: TestClient, regions: Regions) -> None:
    regions.answers["cheap"] = no_answer
    assert place(client, "k-5").status_code == 503
    # It never reserved (it refuses the key now): the job is routed afresh.
    regions.answers["cheap"] = refuse
    again = place(client, "k-5")
    assert again.status_code == 201 and again.json()["region"] == "mid"
    assert [r for r, key, _ in regions.seen if key == "k-5"] == ["cheap", "cheap", "mid"]


def test_a_region_another_replica_retired_is_not_routed_to(
    client: TestClient, regions: Regions
) -> None:
    """Retiring stops routing at once, on every replica: one that has not reread the
    regions table since (it does every second) must not forward there meanwhile."""
    app: Any = client.app
    assert place(client).json()["region"] == "cheap"  # this replica has read the table
    # Another replica's retirement: the same transaction, on the shared database.
    assert store.retire(app.state.federation.engine, "cheap", datetime.now(UTC)) is not None
    answer = place(client)
    assert answer.status_code == 201, answer.text
    assert answer.json()["region"] == "mid"
    assert [r for r, _, _ in regions.seen] == ["cheap", "mid"]
    # Found retired, the table is read again: the next request does not rank it at all.
    later = place(client).json()
    assert [a["region"] for a in later["attempts"]] == ["mid"]
    assert "cheap" not in {c["region"] for c in later["alternatives"]}


def error_answer(status: int, code: str) -> Answer:
    """A region's error answer in the service's shape."""
    body = {"error": {"code": code, "message": code, "detail": {}}}
    return lambda request: httpx.Response(status, json=body)


def routed(regions: Regions, key: str) -> list[str]:
    return [r for r, sent_key, _ in regions.seen if sent_key == key]


# A keyed job's allocation may already be in the region its key went to: only an answer
# that shows the region looked the key up and holds nothing for it (it found nothing to
# place: unschedulable, unresolvable) lets the key move on. Any other answer there
# (the first request still committing, the key used for another request, the region's
# database, rate limit or token trouble) must leave the job where it is, or a second
# allocation is made in another region.
@pytest.mark.parametrize(
    ("status", "code", "answered"),
    [
        (409, "idempotency_key_in_flight", 409),
        (409, "conflict", 409),
        (503, "database_unavailable", 503),
        (500, "internal_error", 503),
        (429, "rate_limited", 503),
        (401, "unauthorized", 503),
    ],
)
def test_a_keyed_region_that_answers_without_looking_keeps_the_key(
    client: TestClient, regions: Regions, status: int, code: str, answered: int
) -> None:
    regions.answers["cheap"] = no_answer
    assert place(client, "k-6").status_code == 503  # it may have reserved
    regions.answers["cheap"] = error_answer(status, code)
    again = place(client, "k-6")
    assert again.status_code == answered, again.text
    assert routed(regions, "k-6") == ["cheap", "cheap"], "the key went to another region"
    if answered == 409:
        assert again.json()["error"]["code"] == code
    # Once the region answers for the key, the job is where its key went.
    regions.answers["cheap"] = answering("cheap", replayed=True)
    last = place(client, "k-6")
    assert last.status_code == 200 and last.json()["region"] == "cheap"


def test_a_region_whose_database_failed_at_the_commit_keeps_the_key(
    client: TestClient, regions: Regions
) -> None:
    """A region's 503 at its commit may hide a commit that landed (docs/reliability.md):
    the key's retry goes there and gets that allocation, not a second one elsewhere."""
    regions.answers["cheap"] = error_answer(503, "database_unavailable")
    answer = place(client, "k-7")
    assert answer.status_code == 503 and answer.json()["error"]["code"] == "region_unavailable"
    assert routed(regions, "k-7") == ["cheap"]
    regions.answers["cheap"] = answering("cheap", replayed=True)
    again = place(client, "k-7")
    assert again.status_code == 200 and again.json()["region"] == "cheap"
    assert again.json()["replayed"] is True
    # Without a key nothing can find that allocation again: the next region is tried.
    regions.answers["cheap"] = error_answer(503, "database_unavailable")
    assert place(client).json()["region"] == "mid"


@pytest.fixture
def replica(settings: Settings, clock: FakeClock, regions: Regions) -> Iterator[TestClient]:
    """A second global replica on the same database, forwarding to the same regions."""
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as second:
        app.state.federation_client = httpx.AsyncClient(
            transport=httpx.MockTransport(regions.handle)
        )
        yield second


def test_twin_requests_on_two_replicas_place_the_key_once(
    client: TestClient, replica: TestClient, regions: Regions
) -> None:
    """A dispatcher retries on another replica while its first call is still forwarding.
    The first call's region refuses it (full a moment ago) and the first call moves on,
    while the region could take the twin a moment later: routed on its own, the twin
    would be placed there and the first call in the next region, one key with two
    allocations. The twin is told the key is in flight instead."""
    first_in, release_first, first_done, twin_in = (threading.Event() for _ in range(4))
    calls: list[str] = []

    def cheap(request: httpx.Request) -> httpx.Response:
        calls.append("cheap")
        if len(calls) == 1:  # the first call
            first_in.set()
            assert release_first.wait(10)
            return refuse(request)
        twin_in.set()  # the twin, routed there too
        assert first_done.wait(10)
        return allocation("cheap")

    regions.answers["cheap"] = cheap
    answers: dict[str, httpx.Response] = {}
    first = threading.Thread(target=lambda: answers.update(first=place(client, "k-twin")))
    twin = threading.Thread(target=lambda: answers.update(twin=place(replica, "k-twin")))
    first.start()
    assert first_in.wait(10)
    twin.start()
    deadline = time.monotonic() + 10
    while twin.is_alive() and not twin_in.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)
    release_first.set()
    first.join(10)
    first_done.set()
    twin.join(10)
    assert not first.is_alive() and not twin.is_alive()
    assert answers["first"].status_code == 201 and answers["first"].json()["region"] == "mid"
    assert answers["twin"].status_code == 409, answers["twin"].text
    assert answers["twin"].json()["error"]["code"] == "idempotency_key_in_flight"
    placed = [r for r, key, _ in regions.seen if key == "k-twin"]
    assert placed == ["cheap", "mid"], "the twin was forwarded on its own"
    # Once the first call is done, the key's retry (on either replica) is its answer.
    regions.answers["mid"] = answering("mid", replayed=True)
    again = place(replica, "k-twin")
    assert again.status_code == 200 and again.json()["region"] == "mid", again.text
    assert again.json()["replayed"] is True


def test_a_key_held_by_a_replica_that_died_is_taken_when_its_time_is_up(
    client: TestClient, regions: Regions, clock: FakeClock
) -> None:
    app: Any = client.app
    engine = app.state.federation.engine
    until = clock() + timedelta(seconds=20)
    assert store.hold_key(engine, "k-dead", "mid", "H100", "gone", clock(), until)
    held = place(client, "k-dead")
    assert held.status_code == 409, held.text
    assert held.json()["error"]["code"] == "idempotency_key_in_flight"
    assert regions.seen == []
    clock.advance(21)
    regions.answers["mid"] = answering("mid", replayed=True)
    taken = place(client, "k-dead")
    assert taken.status_code == 200 and taken.json()["region"] == "mid", taken.text


# A region's 201 is trusted only as far as it is an allocation: one that is not JSON, or
# no allocation, is an answer lost (the region may have reserved), as is one that never
# ends within the forward's time or grows past any allocation's size.
GARBAGE = [
    pytest.param(b"<html>502 from a proxy</html>", id="not-json"),
    pytest.param(b"[1, 2]", id="a-list"),
    pytest.param(b'{"id": "a", "tasks": [{"gpu_uuids": ["GPU-0"]}]}', id="a-task-without-node"),
    pytest.param(b'{"id": "a", "tasks": "n1"}', id="tasks-not-a-list"),
]


@pytest.mark.parametrize("content", GARBAGE)
def test_a_placed_answer_that_is_no_allocation_is_an_answer_lost(
    client: TestClient, regions: Regions, content: bytes
) -> None:
    regions.answers["cheap"] = lambda request: httpx.Response(201, content=content)
    keyed = place(client, "k-8")
    assert keyed.status_code == 503, keyed.text
    assert keyed.json()["error"]["code"] == "region_unavailable"
    assert routed(regions, "k-8") == ["cheap"]
    unkeyed = place(client)
    assert unkeyed.status_code == 201 and unkeyed.json()["region"] == "mid", unkeyed.text
    assert unkeyed.json()["attempts"][0]["outcome"] == "unanswered"


class Stream(httpx.AsyncByteStream):
    """A region's answer sent in pieces, counting what the global service read."""

    def __init__(self, pieces: int, piece: bytes, pause_s: float = 0.0) -> None:
        self.pieces, self.piece, self.pause_s = pieces, piece, pause_s
        self.sent = 0

    async def __aiter__(self) -> Any:
        import asyncio

        yield b'{"id": "a", "tasks": [{"node": "n1", "gpu_uuids": ["GPU-0"]}], "pad": "'
        for _ in range(self.pieces):
            if self.pause_s:
                await asyncio.sleep(self.pause_s)
            self.sent += 1
            yield self.piece
        yield b'"}'


def test_a_huge_placed_answer_is_not_read_whole(client: TestClient, regions: Regions) -> None:
    stream = Stream(1024, b"x" * 65536)  # 64 MiB
    regions.answers["cheap"] = lambda request: httpx.Response(201, stream=stream)
    answer = place(client, "k-9")
    assert answer.status_code == 503, answer.text[:300]
    assert answer.json()["error"]["code"] == "region_unavailable"
    assert stream.sent < 100, f"read {stream.sent} pieces of 64 KiB"


def test_a_region_that_answers_a_byte_at_a_time_is_cut_at_its_time(
    client: TestClient, regions: Regions
) -> None:
    """httpx's timeout is per read: an answer trickled in under it never timed out."""
    stream = Stream(40, b"x", pause_s=0.1)  # 4 s, a read every 0.1 s
    regions.answers["cheap"] = lambda request: httpx.Response(201, stream=stream)
    began = time.monotonic()
    answer = client.post(
        "/v1/federation/place",
        json={"gpus": 2, "federation": {"deadline_s": 1.0}},
        headers={"Idempotency-Key": "k-10"},
    )
    took = time.monotonic() - began
    assert answer.status_code == 503, answer.text[:300]
    # Cut near its 1 s deadline, well before the whole answer's 4 s (the margin is a slow
    # machine's); the pieces sent say the same.
    assert took < 3.5, f"the forward took {took:.1f} s of a 1 s deadline"
    assert stream.sent < 40


def test_a_compressed_placed_answer_is_not_unpacked(client: TestClient, regions: Regions) -> None:
    """Asked for an uncompressed answer, a region sending gzip anyway is not unpacked: a
    few KiB of it could be gigabytes at once, past the bound on what is read."""
    import gzip

    packed = gzip.compress(allocation("cheap").content)
    regions.answers["cheap"] = lambda request: httpx.Response(
        201, content=packed, headers={"Content-Encoding": "gzip"}
    )
    answer = place(client, "k-11")
    assert answer.status_code == 503, answer.text[:300]
    assert "compressed" in answer.json()["error"]["message"]
    assert len(regions.seen) == 1


def test_a_key_retried_on_a_replica_that_has_not_read_its_region_goes_there(
    client: TestClient,
    settings: Settings,
    clock: FakeClock,
    regions: Regions,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A region registered on one replica is known to another at its next reread (each
    second). A key sent to it, unanswered, and retried on the other replica meanwhile was
    told its region was no longer live, and to send the job with a new key: a second
    allocation, the first one's region holding the first."""
    monkeypatch.setattr(registry_module, "REREAD_S", 3600.0)  # no reread during the test
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as replica:
        app.state.federation_client = httpx.AsyncClient(
            transport=httpx.MockTransport(regions.handle)
        )
        assert place(replica).json()["region"] == "cheap"  # it has read the regions
        add_region(client, "cheapest", 0.5)
        regions.answers["cheapest"] = no_answer
        assert place(client, "k-12").status_code == 503
        regions.answers["cheapest"] = answering("cheapest", replayed=True)
        again = place(replica, "k-12")
        assert again.status_code == 200, again.text[:300]
        assert again.json()["region"] == "cheapest" and again.json()["replayed"] is True
        assert again.json()["cloud"] == "aws"


@pytest.mark.parametrize(
    "other",
    [
        {"gpus": 2, "federation": {"regions": ["mid"]}},  # a region the first went to is out
        {"gpus": 2, "gpu_models": ["A100"]},  # another model: the key's region sells H100s
        {"gpus": 2, "federation": {"budget_per_hour": 0.5}},  # under what cheap costs
    ],
)
def test_a_key_sent_again_for_another_request_is_refused(
    client: TestClient, regions: Regions, other: dict[str, Any]
) -> None:
    """The region sees only what is forwarded (no federation options, the model the key
    was priced on), so it would replay the first allocation for a request it does not
    meet: the global service itself must tell the requests apart, as /v1/place does."""
    assert place(client, "k-other").json()["region"] == "cheap"
    regions.answers["cheap"] = answering("cheap", replayed=True)
    again = client.post("/v1/federation/place", json=other, headers={"Idempotency-Key": "k-other"})
    assert again.status_code == 409, again.text
    assert again.json()["error"]["code"] == "conflict"
    assert [r for r, key, _ in regions.seen if key == "k-other"] == ["cheap"]


def test_a_key_sent_again_with_a_longer_deadline_is_the_same_request(
    client: TestClient, regions: Regions
) -> None:
    """The deadline is the caller's patience, not the job: a retry may wait longer."""
    assert place(client, "k-patient").json()["region"] == "cheap"
    regions.answers["cheap"] = answering("cheap", replayed=True)
    again = client.post(
        "/v1/federation/place",
        json={"gpus": 2, "federation": {"deadline_s": 30}},
        headers={"Idempotency-Key": "k-patient"},
    )
    assert again.status_code == 200, again.text
    assert again.json()["region"] == "cheap" and again.json()["replayed"] is True


def test_a_keyed_retry_whose_deadline_passed_before_its_region_keeps_the_key(
    client: TestClient, regions: Regions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry whose deadline_s ran out before it reached its key's region (a slow read of
    the key's row) never asked that region, which may hold the first call's allocation:
    the key must stay there. It was dropped as if every region had refused it, and the
    next retry reserved again in another region."""
    regions.answers["cheap"] = no_answer
    assert place(client, "k-late").status_code == 503  # cheap may have reserved
    take_key = store.take_key

    def slow_take_key(*args: Any, **kwargs: Any) -> tuple[str, str] | None:
        time.sleep(0.3)  # past the retry's deadline
        return take_key(*args, **kwargs)

    monkeypatch.setattr(store, "take_key", slow_take_key)
    late = client.post(
        "/v1/federation/place",
        json={"gpus": 2, "federation": {"deadline_s": 0.1}},
        headers={"Idempotency-Key": "k-late"},
    )
    assert late.status_code == 503, late.text
    error = late.json()["error"]
    assert error["code"] == "region_unavailable" and "same key" in error["message"]
    assert late.headers["Retry-After"]
    assert routed(regions, "k-late") == ["cheap"], "the late retry was forwarded"
    monkeypatch.setattr(store, "take_key", take_key)
    # The key is still cheap's: an unreachable cheap keeps it, nothing is reserved elsewhere.
    regions.answers["cheap"] = hang_up
    kept = place(client, "k-late")
    assert kept.status_code == 503, kept.text
    assert routed(regions, "k-late") == ["cheap", "cheap"], "the key was reserved again"


def store_url(client: TestClient, region: str, url: str) -> None:
    """A URL stored before registration checked it this strictly, read by the replica."""
    app: Any = client.app
    registry = app.state.federation
    with registry.engine.begin() as conn:
        conn.execute(regions_table.update().where(regions_table.c.name == region).values(url=url))
    registry.invalidate()


BAD_URLS = [
    "ftp://cheap.example",
    "cheap.example:8080",
    "http://cheap.example\t",
    "http://cheap.example:99999",
    "http://ops:secret@cheap.example",
    # Parsed by httpx, but its host is no IDNA label: httpx raised at the forward (a 500).
    "http://xn--a.example",
]


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_region_with_a_bad_stored_url_is_skipped_with_a_warning(
    client: TestClient, regions: Regions, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store_url(client, "cheap", url)
    with caplog.at_level(logging.WARNING, logger="topoplace.federation"):
        first = place(client, "k-url")
        second = place(client)
    assert first.status_code == 201, first.text
    assert first.json()["region"] == "mid"
    assert first.json()["attempts"][0]["outcome"] == "skipped"
    assert "http(s)://host" in first.json()["attempts"][0]["detail"]
    assert second.status_code == 201 and second.json()["region"] == "mid", second.text
    assert [r for r, _, _ in regions.seen] == ["mid", "mid"]
    told = [r for r in caplog.records if "cheap" in r.getMessage()]
    assert len(told) == 1 and told[0].levelno == logging.WARNING  # once, not per request


def held_at_a_bad_stored_url(client: TestClient, regions: Regions, key: str) -> None:
    """cheap has a URL with credentials stored, and does not answer; ``key`` was forwarded
    there by a replica that predates the check: the key is cheap's."""
    store_url(client, "cheap", "http://ops:secret@cheap.example")
    regions.answers["cheap"] = no_answer
    app: Any = client.app
    engine = app.state.federation.engine
    now = datetime.now(UTC)
    assert store.hold_key(engine, key, "cheap", "H100", "old", now, now)
    store.let_go_key(engine, key, "old")


def test_a_key_whose_region_has_a_bad_stored_url_stays_there(
    client: TestClient, regions: Regions
) -> None:
    """A URL with credentials took forwards: the region may hold the key's allocation."""
    held_at_a_bad_stored_url(client, regions, "k-cred")
    answer = place(client, "k-cred")
    assert answer.status_code == 503, answer.text
    assert answer.json()["error"]["code"] == "region_unavailable"
    assert "same key" in answer.json()["error"]["message"]
    assert regions.seen == []


def _seen_urls(regions: Regions, name: str) -> list[str]:
    urls: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        urls.append(str(request.url))
        return allocation(name)

    regions.answers[name] = answer
    return urls


def test_a_key_held_by_a_bad_url_goes_to_the_url_set_right(
    client: TestClient, regions: Regions
) -> None:
    held_at_a_bad_stored_url(client, regions, "k-fix")
    assert place(client, "k-fix").status_code == 503

    urls = _seen_urls(regions, "cheap")
    fixed = client.patch("/v1/regions/cheap", json={"url": "http://cheap.example:8080/tp"})
    assert fixed.status_code == 200, fixed.text
    answer = place(client, "k-fix")
    assert answer.status_code == 201, answer.text
    assert answer.json()["region"] == "cheap"
    assert urls == ["http://cheap.example:8080/tp/v1/place"]


def test_an_update_made_on_another_replica_is_forwarded_to(
    client: TestClient, regions: Regions
) -> None:
    """Another replica's update: this registry keeps its read of the table (the region's
    summary has not moved), and the forward still goes to the URL stored now."""
    assert place(client, "k-before").json()["region"] == "cheap"
    app: Any = client.app
    registry = app.state.federation
    urls = _seen_urls(regions, "cheap")
    changes = {"url": "http://cheap.example:9000", "forward_token": "tpp_other_replica"}
    assert store.update(registry.engine, "cheap", changes, datetime.now(UTC)) is not None
    assert registry.record("cheap").url == "http://cheap.example"  # this replica's read
    tokens: list[str | None] = []
    answer = regions.answers["cheap"]

    def with_token(request: httpx.Request) -> httpx.Response:
        tokens.append(request.headers.get("authorization"))
        return answer(request)

    regions.answers["cheap"] = with_token
    placed = place(client, "k-after")
    assert placed.status_code == 201 and placed.json()["region"] == "cheap", placed.text
    assert urls == ["http://cheap.example:9000/v1/place"]
    assert tokens == ["Bearer tpp_other_replica"]


def test_a_key_whose_region_was_retired_is_told_to_use_a_new_key_not_to_retry(
    client: TestClient, regions: Regions
) -> None:
    """The key's allocation, if any, is in the retired region, where no forward goes now:
    the same key can never be answered otherwise. It was answered 409 ``no_region``, the
    code of "nothing fits now", with Retry-After, so a dispatcher retrying as told got the
    same answer for as long as the key is kept (a week)."""
    regions.answers["cheap"] = no_answer
    assert place(client, "k-retired").status_code == 503  # the key stays at cheap
    assert client.post("/v1/regions/cheap/retire?force=true").status_code == 200
    again = place(client, "k-retired")
    assert again.status_code == 409, again.text
    error = again.json()["error"]
    assert error["code"] == "region_retired", error
    assert "new key" in error["message"] and "cheap" in error["message"]
    assert "retry-after" not in again.headers
    assert [a["region"] for a in error["detail"]["attempts"]] == ["cheap"]


def test_a_looked_up_code_under_a_server_error_keeps_the_key(
    client: TestClient, regions: Regions
) -> None:
    """Only the region's own refusal after looking the key up frees it: ``unschedulable``
    is 409 and ``unresolvable`` 422 there. The same code under a 5xx (a proxy's or a
    failing region's answer wrapped in it) is no such look-up, and the allocation the
    key's first forward may have made is still there: the key stays."""
    regions.answers["cheap"] = no_answer
    assert place(client, "k-5xx").status_code == 503

    def wrapped(request: httpx.Request) -> httpx.Response:
        error = {"code": "unschedulable", "message": "nothing fits now", "detail": {}}
        return httpx.Response(502, json={"error": error})

    regions.answers["cheap"] = wrapped
    again = place(client, "k-5xx")
    assert again.status_code == 503, again.text
    assert again.json()["error"]["code"] == "region_unavailable"
    assert {r for r, key, _ in regions.seen if key == "k-5xx"} == {"cheap"}


def test_a_token_revoked_while_a_region_hung_forwards_nothing_more(
    client: TestClient, regions: Regions
) -> None:
    """A scheduler token revoked while its job waited on a region that never answered
    (up to half of deadline_s, 150 s at most) places nothing in the next region: the
    forward is the request's write, and its token was revoked before it left."""
    made = client.post("/v1/tokens", json={"role": "scheduler", "name": "dispatcher"})
    assert made.status_code == 201, made.text
    token_id, token = made.json()["id"], made.json()["token"]
    app: Any = client.app

    def revoked_meanwhile(request: httpx.Request) -> httpx.Response:
        # The revocation lands while the first region hangs (here: as it answers nothing).
        token_store.revoke(app.state.service.engine, token_id)
        app.state.token_check.drop(token_id)
        raise httpx.ReadTimeout("timed out", request=request)

    regions.answers["cheap"] = revoked_meanwhile
    answer = client.post(
        "/v1/federation/place", json={"gpus": 2}, headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 401, answer.text
    assert answer.json()["error"]["code"] == "unauthorized"
    assert [region for region, _, _ in regions.seen] == ["cheap"], "forwarded after revocation"


def test_a_job_naming_models_is_forwarded_for_the_design_chosen_not_all_the_price_covers(
    client: TestClient, regions: Regions
) -> None:
    """The price "H100" covers every H100 the region has (80GB HBM3, NVL...): forwarded as
    the price's model alone, a job that asked for "H100 80GB" could be placed on an H100
    NVL. It goes for the design's own model, which it asked for and which is priced."""
    job = {"gpus": 2, "gpu_models": ["H100 80GB"]}
    answer = client.post("/v1/federation/place", json=job, headers={"Idempotency-Key": "k-m"})
    assert answer.status_code == 201, answer.text
    assert answer.json()["gpu_model"] == "H100"  # what was priced
    again = client.post("/v1/federation/place", json=job, headers={"Idempotency-Key": "k-m"})
    assert again.status_code == 201, again.text
    sent = [(region, body["gpu_models"]) for region, _, body in regions.seen]
    assert sent == [("cheap", ["NVIDIA H100 80GB HBM3"])] * 2  # the retry asks the same
    # A job naming no model, or one that takes every model the price covers, goes for
    # the price's model, as before.
    assert place(client).status_code == 201
    assert regions.seen[-1][2]["gpu_models"] == ["H100"]
    both = {"gpus": 2, "gpu_models": ["A100", "h100"]}
    assert client.post("/v1/federation/place", json=both).status_code == 201
    assert regions.seen[-1][2]["gpu_models"] == ["H100"]


def test_a_key_sent_for_the_priced_model_before_is_sent_so_again(
    client: TestClient, regions: Regions
) -> None:
    """A key forwarded as the price's model (before forwards named the design's) is
    forwarded so on its retry: the region replays only the request it stored."""
    app: Any = client.app
    engine = app.state.federation.engine
    now = datetime.now(UTC)
    assert store.hold_key(engine, "k-old", "cheap", "H100", "old", now, now)
    store.let_go_key(engine, "k-old", "old")
    job = {"gpus": 2, "gpu_models": ["H100 80GB"]}
    answer = client.post("/v1/federation/place", json=job, headers={"Idempotency-Key": "k-old"})
    assert answer.status_code == 201, answer.text
    assert [(r, b["gpu_models"]) for r, _, b in regions.seen] == [("cheap", ["H100"])]


def test_a_design_model_shortened_to_fit_is_forwarded_as_the_price_model() -> None:
    """A GPU model the region shortened (its start, '~' and a hash) names no GPU there."""
    long_model = "NVIDIA H100 " + "x" * 200
    job = FederatedPlaceRequest.model_validate({"gpus": 2, "gpu_models": ["NVIDIA H100"]})
    for model, sent in (
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"),
        (summary_limits.shortened(long_model, MAX_GPU_MODEL_NAME), "H100"),
    ):
        chosen = ranking.Candidate("r", "aws", True, "fits", gpu_model="H100", design_model=model)
        assert routing.forward_model(job, chosen) == sent
