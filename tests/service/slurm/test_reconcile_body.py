"""POST /v1/slurm/reconcile's body: a whole production queue's `squeue --json`, pushed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.app import create_app
from service.edge import guard
from service.edge.json_scan import MAX_DEPTH
from service.settings import Settings
from service.slurm import json_command
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.slurm.captured import pending_queue
from tests.service.slurm.squeue import live

JSON = {"Content-Type": "application/json"}
MIB = 1024 * 1024


def test_a_queue_over_the_general_limit_is_read_on_this_route_alone(
    dgx1: TestClient, clock: FakeClock
) -> None:
    """1,651 pending jobs as Slurm 22.05 prints them, 5 MiB: over the 4 MiB every other
    route keeps, well under the reconcile route's own limit. It was refused with 413, so
    the cron push of a real queue never released anything; now the orphan goes."""
    body, _ = pending_queue(5 * MIB)
    settings = dgx1.app.state.service.settings  # type: ignore[attr-defined]
    assert settings.max_body_bytes < len(body) <= settings.max_reconcile_body_bytes
    submitted = {"tres_per_node": "gres:gpu:1", "user_name": "alice"}
    orphan = dgx1.post("/v1/slurm/job-submit", json=submitted).json()["allocation_ids"]
    clock.advance(60)  # no job of the queue names it
    pushed = dgx1.post("/v1/slurm/reconcile", content=body, headers=JSON)
    assert pushed.status_code == 200, pushed.text[:300]
    assert pushed.json()["released"] == orphan and live(dgx1) == []
    elsewhere = dgx1.post("/v1/slurm/job-started", content=body, headers=JSON)
    assert elsewhere.status_code == 413, elsewhere.text[:300]
    error = elsewhere.json()["error"]
    assert error["code"] == "payload_too_large"
    assert error["detail"]["limit"] == settings.max_body_bytes
    assert "TOPOPLACE_MAX_BODY_BYTES" in error["message"], error["message"]


@pytest.fixture
def six_mib(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    """The service with a reconcile limit of 6 MiB."""
    limited = secured(settings).model_copy(update={"max_reconcile_body_bytes": 6 * MIB})
    app = create_app(limited, clock=clock, background=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as c:
        yield c


def test_a_push_past_the_reconcile_limit_is_413_naming_its_setting(six_mib: TestClient) -> None:
    body, _ = pending_queue(6 * MIB + 1)
    refused = six_mib.post("/v1/slurm/reconcile", content=body, headers=JSON)
    assert refused.status_code == 413, refused.text[:300]
    error = refused.json()["error"]
    assert error["code"] == "payload_too_large" and error["detail"]["limit"] == 6 * MIB
    assert "TOPOPLACE_MAX_RECONCILE_BODY_BYTES" in error["message"], error["message"]
    at, _ = pending_queue(6 * MIB - 4000)
    assert six_mib.post("/v1/slurm/reconcile", content=at, headers=JSON).status_code == 200


def test_only_a_token_allowed_to_push_gets_its_body_read(client: TestClient) -> None:
    """The token check runs before the body is read: a viewer's 5 MiB push is refused for
    its token (403), not read, whatever its size; the larger limit is a scheduler's."""
    created = client.post("/v1/tokens", json={"role": "viewer", "name": "cron-viewer"})
    assert created.status_code == 201, created.text
    viewer = {**JSON, "Authorization": f"Bearer {created.json()['token']}"}
    body, _ = pending_queue(5 * MIB)
    refused = client.post("/v1/slurm/reconcile", content=body, headers=viewer)
    assert refused.status_code == 403, refused.text[:300]
    assert refused.json()["error"]["code"] == "forbidden"


@pytest.mark.parametrize("value", [1023, 1024 * MIB + 1])
def test_the_reconcile_limit_is_refused_outside_its_bounds(value: int) -> None:
    with pytest.raises(ValidationError, match="max_reconcile_body_bytes"):
        Settings(max_reconcile_body_bytes=value)


@pytest.mark.parametrize("value", [1024, 1024 * MIB])
def test_the_reconcile_limit_is_taken_at_its_bounds(value: int) -> None:
    assert Settings(max_reconcile_body_bytes=value).max_reconcile_body_bytes == value


def test_other_requests_are_answered_while_a_push_is_decoded(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The push is decoded on a worker thread: held there, it keeps no other request
    waiting. Decoded on the event loop (as FastAPI decoded it), the request below could
    not be answered before the decode ended."""
    decoding, answered = threading.Event(), threading.Event()
    decode = json_command.parse_json

    def held(raw: bytes) -> Any:
        decoding.set()
        answered.wait(timeout=10)
        return decode(raw)

    monkeypatch.setattr(json_command, "parse_json", held)
    body, _ = pending_queue(64 * 1024)
    with ThreadPoolExecutor(1) as pool:
        push = pool.submit(client.post, "/v1/slurm/reconcile", content=body, headers=JSON)
        try:
            assert decoding.wait(timeout=10), "the push was not decoded by json_command"
            other = client.get("/v1/allocations")
            assert other.status_code == 200 and not push.done()
        finally:
            answered.set()
        assert push.result(timeout=30).status_code == 200


def test_a_thread_decoding_a_queue_gives_the_others_turns_between_its_jobs() -> None:
    """json.loads holds the GIL for the whole document: from a worker thread a 20 MB
    answer stalled the event loop as long as on it (125 ms). parse_json decodes a job at a
    time, so the thread that waits for the GIL gets it at every switch interval (5 ms):
    counted here in turns, whatever the machine's speed (json.loads gives 1 or 2)."""
    body, _ = pending_queue(16 * MIB)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (json_command.parse_json(body), done.set()))
    turns = 0
    worker.start()
    while not done.is_set():
        time.sleep(0)  # gives the GIL up; it comes back when the decoding thread lets go
        turns += 1
    worker.join()
    assert turns >= 10, turns


def test_a_push_is_checked_for_depth_off_the_loop_and_refused_as_before(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard's depth scan of a whole body runs on the loop (20 MB of squeue: 330 ms):
    this route's decoder checks each job instead, and a push nested too deep is refused in
    the guard's words (422 invalid_request, `body`)."""
    scanned: list[bool] = []
    scan = guard.too_deep
    monkeypatch.setattr(guard, "too_deep", lambda body: scanned.append(True) or scan(body))
    body, _ = pending_queue(64 * 1024)
    assert client.post("/v1/slurm/reconcile", content=body, headers=JSON).status_code == 200
    assert scanned == [], "the reconcile body was scanned on the loop"
    deep = b'{"jobs": [' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"]}"
    refused = client.post("/v1/slurm/reconcile", content=deep, headers=JSON)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid_request" and error["detail"]["field"] == "body"
    assert f"nested deeper than {MAX_DEPTH}" in error["message"], error["message"]
    client.post("/v1/slurm/job-started", content=deep, headers=JSON)
    assert scanned, "other routes' bodies are scanned as before"
