"""POST /v1/slurm/reconcile's body: a whole production queue's `squeue --json`, pushed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.app import create_app
from service.settings import Settings
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.slurm.squeue import live, pending_queue

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
