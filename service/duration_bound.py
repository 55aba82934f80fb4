"""Settings' durations bounded to what a datetime and a sleep hold.

A duration setting (a field named ``*_s``, ``*_ms`` or ``*_days``) is added to or taken
from now somewhere: a heartbeat's staleness, a reconcile's grace, the audit log's
retention. "inf", "nan" or 1e12 seconds was taken at start and failed later, on every
request that did that arithmetic (OverflowError: a 500), or stopped a loop that slept
for it. Refused at start instead, naming the variable. Rates (``*_per_s``) are not
durations and keep their own bounds.
"""

from __future__ import annotations

import math

from pydantic import ValidationInfo, field_validator
from pydantic_settings import BaseSettings

# About 31 years: now plus or minus it is a datetime, and a sleep takes it.
MAX_DURATION_S = 1e9
_SECONDS_PER = {"_ms": 1e-3, "_s": 1.0, "_days": 86_400.0}


def seconds_per_unit(field: str) -> float | None:
    """Seconds per unit of a duration setting named ``field``; None when it is none."""
    if field.endswith("_per_s"):
        return None
    return next((per for suffix, per in _SECONDS_PER.items() if field.endswith(suffix)), None)


class DurationBound(BaseSettings):
    """A settings class whose durations are finite and at most MAX_DURATION_S."""

    @field_validator("*", mode="after")
    @classmethod
    def _bounded(cls, value: object, info: ValidationInfo) -> object:
        per = seconds_per_unit(info.field_name or "")
        if per is None or not isinstance(value, int | float) or isinstance(value, bool):
            return value
        if not math.isfinite(value) or abs(value) * per > MAX_DURATION_S:
            variable = f"{cls.model_config.get('env_prefix', '')}{info.field_name}".upper()
            raise ValueError(
                f"{variable} ({info.field_name}) must be a finite duration of at most"
                f" {MAX_DURATION_S / per:g}"
            )
        return value
