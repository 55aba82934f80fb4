"""bench.device_plugin runs its real admission path (figures are the bench's, not checked here)."""

from __future__ import annotations

from bench import device_plugin


def test_a_few_admissions_give_the_last_reservation_every_time():
    result = device_plugin.run(samples=3, api_ms=0.0)
    assert set(result) == {"p50", "p99", "cpu_p50", "cpu_p99", "floor_p50", "floor_p99"}
    assert result["p50"] > 0
