"""Every duration setting is refused at start past what a datetime and a sleep hold."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic_settings import BaseSettings

from service.app import create_app
from service.duration_bound import MAX_DURATION_S, seconds_per_unit
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from service.slurm.settings import SlurmSettings
from tests.service.conftest import FakeClock

CLASSES: list[type[BaseSettings]] = [Settings, SlurmSettings, ExtenderSettings]
DURATIONS = [
    (cls, name)
    for cls in CLASSES
    for name, field in cls.model_fields.items()
    if seconds_per_unit(name) is not None and field.annotation in (int, float, "int", "float")
]


def test_the_durations_are_found() -> None:
    names = {name for _, name in DURATIONS}
    assert {"heartbeat_ttl_s", "audit_retention_days", "reconcile_grace_s"} <= names
    assert "rate_limit_per_s" not in names  # a rate, not a duration


@pytest.mark.parametrize(("cls", "name"), DURATIONS, ids=lambda v: getattr(v, "__name__", v))
@pytest.mark.parametrize("given", ["inf", "nan", "1e12"])
def test_a_duration_past_a_datetime_is_refused_at_start(
    cls: type[BaseSettings], name: str, given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = cls.model_config.get("env_prefix", "")
    monkeypatch.setenv(f"{prefix}{name}".upper(), given)
    with pytest.raises(ValueError, match=name):
        cls()


def test_the_longest_heartbeat_ttl_taken_serves(settings: Settings, clock: FakeClock) -> None:
    """The bound itself is safe: "inf" here had the service fail to start (now minus it)."""
    longest = settings.model_copy(update={"heartbeat_ttl_s": MAX_DURATION_S})
    with TestClient(create_app(longest, clock=clock, background=False)) as client:
        assert client.get("/v1/nodes").status_code == 200
