"""/metrics counts allocation events on the event stream: what a watcher sees, watched or not."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi.testclient import TestClient

from service.allocations import api
from service.state import ServiceState
from tests.service.allocations.test_events_per_change import Watcher
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.metrics.scrape import parse, total


def _counts(client: TestClient) -> Counter[str]:
    _, samples = parse(client.get("/metrics").text)
    types = ("placed", "confirmed", "extended", "released", "expired")
    return Counter(
        {t: int(total(samples, "topoplace_events_total", kind="allocation", type=t)) for t in types}
    )


def _lifecycle(client: TestClient, state: ServiceState, clock: FakeClock, job: str) -> None:
    """Each change once, and calls that change nothing."""
    assert client.post("/v1/nodes/ev-h100/heartbeat").status_code == 204  # not stale
    ids = []
    for i in range(4):
        placed = client.post("/v1/place", json={"gpus": 1, "job_id": f"{job}-{i}"})
        assert placed.status_code == 201, placed.text
        ids.append(placed.json()["id"])
    one: Any = ids[0]
    assert client.post(f"/v1/allocations/{one}/confirm").status_code == 200
    assert client.post(f"/v1/allocations/{one}/confirm").status_code == 200  # no change
    assert client.post(f"/v1/allocations/{ids[1]}/extend", json={"ttl_s": 600}).status_code == 200
    assert client.post(f"/v1/allocations/{ids[2]}/release").status_code == 200
    assert client.post(f"/v1/allocations/{ids[2]}/release").status_code == 200  # ended already
    clock.advance(130)  # past the TTL of the pending one (120 s)
    assert len(api.sweep(state).ids) == 1
    assert client.post(f"/v1/jobs/{job}-0/release").status_code == 200
    assert client.post(f"/v1/jobs/{job}-1/release").status_code == 200


def test_the_counts_are_the_events_a_watcher_sees(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "ev-h100"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    watcher = Watcher(state.events, state.engine)
    try:
        watcher.since_last()
        before = _counts(client)
        _lifecycle(client, state, clock, "watched")
        seen = Counter(t for t, _, _ in watcher.since_last())
    finally:
        watcher.close()
    assert seen == {"placed": 4, "confirmed": 1, "extended": 1, "released": 3, "expired": 1}
    watched = _counts(client) - before
    assert watched == seen
    # Nobody watching: the same changes, counted the same, without the events being built.
    assert not state.events.watched
    before = _counts(client)
    _lifecycle(client, state, clock, "unwatched")
    assert _counts(client) - before == seen
