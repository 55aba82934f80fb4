"""Settings that contradict each other are refused when the service starts."""

from __future__ import annotations

import pytest

from service.settings import Settings


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
