"""Settings that contradict each other are refused when the service starts."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.duration_bound import MAX_DURATION_S
from service.settings import Settings
from tests.service.conftest import FakeClock


@pytest.mark.parametrize(
    "given",
    [
        # Every /place without ttl_s was refused 400 "ttl_s 600 is over the limit of 300
        # seconds", blaming a field the client never sent.
        {"reservation_ttl_s": 600, "max_reservation_ttl_s": 300},
        {"reservation_ttl_s": 0.5},  # under the default minimum of 1 s: the same, 400
        {"reservation_ttl_s": 5, "min_reservation_ttl_s": 10},
        # Past what a datetime holds: every /place without ttl_s was a 500.
        {"reservation_ttl_s": 1e12, "max_reservation_ttl_s": 1e13},
    ],
)
def test_a_default_ttl_the_bounds_refuse_is_refused_at_start(given: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="TOPOPLACE_RESERVATION_TTL_S"):
        Settings(**given)  # type: ignore[arg-type]


def test_a_default_ttl_within_the_bounds_is_taken() -> None:
    assert Settings(reservation_ttl_s=60, max_reservation_ttl_s=60).reservation_ttl_s == 60
    assert Settings(reservation_ttl_s=0.1, min_reservation_ttl_s=0.1).reservation_ttl_s == 0.1


@pytest.mark.parametrize("memory", ["inf", "nan", "1e12"])
def test_an_ended_job_memory_past_a_datetime_is_refused_at_start(
    memory: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "inf" (remember for ever) was taken, and every POST /v1/jobs/{job_id}/release then
    # failed 500: the memory's start, now minus it, is no datetime.
    monkeypatch.setenv("TOPOPLACE_ENDED_JOB_MEMORY_S", memory)
    with pytest.raises(ValueError, match="ended_job_memory_s"):
        Settings()


def test_a_release_by_job_remembers_it_for_as_long_as_the_bound_allows(
    settings: Settings, clock: FakeClock
) -> None:
    longest = settings.model_copy(update={"ended_job_memory_s": MAX_DURATION_S})
    with TestClient(create_app(longest, clock=clock, background=False)) as client:
        assert client.post("/v1/jobs/j1/release").json() == {"released": []}
