"""A second replica follows the regions table by seqs: it rereads only what moved."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.federation import store
from service.federation.registry import Registry
from service.schema import regions
from tests.service.federation.test_regions_api import bearer, register, signed, summary


def push(client: TestClient, name: str, token: str, free: int) -> int:
    body = summary(name, free)
    pushed = client.put(f"/v1/regions/{name}/summary", json=signed(body), headers=bearer(token))
    assert pushed.status_code == 200, pushed.text
    seq: int = body["seq"]
    return seq


def test_a_replica_rereads_only_the_regions_whose_seq_moved(client: TestClient) -> None:
    app: Any = client.app
    here: Registry = app.state.federation
    tokens = {name: register(client, name) for name in ("east", "west")}
    for name, token in tokens.items():
        push(client, name, token, 8)
    other = Registry(here.engine, 30.0, here.clock)  # another replica, the same table
    assert other.due
    other.refresh()
    assert [r.name for r in other.regions()] == ["east", "west"]
    east, west = other._known["east"], other._known["west"]

    seq = push(client, "west", tokens["west"], 4)
    other.refresh()
    assert other._known["east"] is east  # unchanged: not read or parsed again
    assert other._known["west"] is not west
    summary = other._known["west"].region.summary
    assert summary is not None and summary.seq == seq
    assert summary.designs[0].free_gpus == 4

    retired = client.post("/v1/regions/east/retire")
    assert retired.status_code == 200, retired.text
    other.refresh()
    assert [r.name for r in other.regions()] == ["west"]


def test_a_change_made_during_a_read_leaves_the_registry_due(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    app: Any = client.app
    registry: Registry = app.state.federation
    registry.reread()
    assert not registry.due
    registry.invalidate()
    assert registry.due
    registry.refresh()  # began after the change: it sees new and retired names
    assert not registry.due

    live_seqs = store.live_seqs

    def changed_meanwhile(engine: Any) -> dict[str, int | None]:
        seqs = live_seqs(engine)
        registry.invalidate()  # a registration here, after the seqs were read
        return seqs

    monkeypatch.setattr(store, "live_seqs", changed_meanwhile)
    registry.refresh()
    assert registry.due  # the next request reads the table again


def test_two_summaries_taken_at_once_leave_the_newer_in_memory(client: TestClient) -> None:
    """Two pushes of one region handled side by side (a retry after a client timeout):
    the older one's stored first and put in memory last, routing went by it until the
    next reread."""
    app: Any = client.app
    registry: Registry = app.state.federation
    token = register(client, "east")
    push(client, "east", token, 8)
    older = store.get(registry.engine, "east")
    seq = push(client, "east", token, 2)
    newer = store.get(registry.engine, "east")
    assert older is not None and newer is not None and newer.summary_seq == seq
    registry.put(newer)
    registry.put(older)  # the older push's thread, last
    kept = registry.record("east")
    assert kept is not None and kept.summary_seq == seq


def test_a_summary_stored_before_its_checks_costs_only_its_own_region(
    client: TestClient,
) -> None:
    """A summary taken when island sizes were checked by str.isdigit() ("²" passed it) can
    no longer be read into the ranking: it left that region unroutable, and failed every
    replica's read of the table, so every federated call was a 500 until it was replaced."""
    app: Any = client.app
    registry: Registry = app.state.federation
    tokens = {name: register(client, name) for name in ("east", "west")}
    for name, token in tokens.items():
        push(client, name, token, 8)
    body = summary("east", 8)
    body["designs"][0]["by_island"] = {"\u00b2": 1}
    with registry.engine.begin() as conn:
        conn.execute(
            regions.update()
            .where(regions.c.name == "east")
            .values(summary=json.dumps(body), summary_seq=body["seq"])
        )
    registry.invalidate()
    scored = client.post("/v1/federation/score", json={"gpus": 8})
    assert scored.status_code == 200, scored.text
    candidates = {c["region"]: c for c in scored.json()["candidates"]}
    assert candidates["west"]["fits"] and not candidates["east"]["fits"]
    assert "cannot be read" in candidates["east"]["reason"]
    other = Registry(registry.engine, 30.0, registry.clock)  # another replica's follow
    other.refresh()
    assert [r.name for r in other.regions()] == ["east", "west"]
    # Its next push replaces it, and it is routed to again.
    push(client, "east", tokens["east"], 8)
    scored = client.post(
        "/v1/federation/score", json={"gpus": 8, "federation": {"regions": ["east"]}}
    )
    assert scored.json()["candidates"][0]["fits"], scored.text
