"""Two `topoplace serve` processes on one Postgres: the lag of notifications, the gauges
of the other replica, and database retries counted."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from sqlalchemy.exc import DBAPIError

from placement.profiles import build_profile
from service.db import retry_transient
from service.metrics.registry import Metrics
from tests.service import replica_processes
from tests.service.conftest import _truncate
from tests.service.metrics.scrape import parse, total
from tests.waiting import wait_until

H100 = {"design": "8xNVIDIA H100 80GB HBM3", "region": "default"}


@pytest.fixture
def replicas(postgres_url: str) -> Iterator[list[str]]:
    _truncate(postgres_url)
    env = {"TOPOPLACE_HEARTBEAT_TTL_S": "3600", "TOPOPLACE_RESERVATION_TTL_S": "3600"}
    with replica_processes.replicas(postgres_url, 2, env) as running:
        yield running.urls


def _samples(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return parse(httpx.get(f"{url}/metrics", trust_env=False).text)[1]


def test_the_other_replica_measures_its_lag_and_shows_the_change(replicas: list[str]) -> None:
    a, b = replicas
    snap = build_profile("hgx-h100", "r-h100")
    body = {"snapshot": snap.model_dump(mode="json")}
    assert httpx.put(f"{a}/v1/nodes/{snap.name}/snapshot", json=body).status_code == 200
    wait_until(
        lambda: total(_samples(b), "topoplace_gpus", **H100, state="free") == 8,
        "replica B to show the node A took",
    )
    placed = httpx.post(f"{a}/v1/place", json={"gpus": 4, "locality": "nvlink"})
    assert placed.status_code == 201, placed.text
    held = wait_until(
        lambda: total(_samples(b), "topoplace_gpus", **H100, state="held") == 4,
        "replica B's gauges to show A's reservation",
    )
    assert held
    lag = _samples(b)
    count = total(lag, "topoplace_replica_notification_lag_seconds_count")
    assert count >= 2  # the snapshot's notification and the reservation's
    assert 0 <= total(lag, "topoplace_replica_notification_lag_seconds_sum") < 10 * count
    # A heard only its own messages, which it skips: no lag measured there.
    assert total(_samples(a), "topoplace_replica_notification_lag_seconds_count") == 0
    # Events are counted where they happen: B placed nothing.
    assert total(_samples(a), "topoplace_events_total", type="placed") == 1
    assert total(_samples(b), "topoplace_events_total", type="placed") == 0


class _Deadlock(Exception):
    sqlstate = "40P01"


def test_retries_of_a_transient_failure_are_counted() -> None:
    metrics = Metrics()
    failures = [DBAPIError("INSERT", {}, _Deadlock()), DBAPIError("INSERT", {}, _Deadlock())]

    def work() -> str:
        if failures:
            raise failures.pop()
        return "done"

    assert retry_transient(work, retried=metrics.retried) == "done"
    value = metrics.registry.get_sample_value("topoplace_database_retries_total")
    assert value == 2
    with pytest.raises(DBAPIError):  # not transient: raised at once, not counted
        retry_transient(
            lambda: (_ for _ in ()).throw(DBAPIError("x", {}, ValueError())),
            retried=metrics.retried,
        )
    assert metrics.registry.get_sample_value("topoplace_database_retries_total") == 2
