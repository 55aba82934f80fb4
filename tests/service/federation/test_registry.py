"""A second replica follows the regions table by seqs: it rereads only what moved."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from service.federation import store
from service.federation.registry import Registry
from service.federation.schemas import RegionSummary
from service.federation.signing import sign_summary

KEY = NodeKey.generate()


def register(client: TestClient, name: str) -> str:
    created = client.post(
        "/v1/regions",
        json={
            "name": name,
            "cloud": "aws",
            "url": f"http://{name}.example",
            "public_key": KEY.public_key,
            "prices": [{"gpu_model": "H100", "on_demand": 2.0}],
            "egress": {"region_gb": 0.0, "internet_gb": 0.0},
        },
    )
    assert created.status_code == 201, created.text
    token: str = created.json()["token"]
    return token


def push(client: TestClient, name: str, token: str, free: int) -> int:
    seq = time.time_ns()
    summary = RegionSummary.model_validate(
        {
            "region": name,
            "seq": seq,
            "sent_at": datetime.now(UTC),
            "designs": [
                {
                    "design": "H100 x8",
                    "gpu_model": "NVIDIA H100 80GB HBM3",
                    "gpus_per_node": 8,
                    "nodes": 1,
                    "free_gpus": free,
                    "island_gbps": 450.0,
                    "by_island": {str(free): 1},
                }
            ],
        }
    ).model_dump(mode="json")
    pushed = client.put(
        f"/v1/regions/{name}/summary",
        json={"summary": summary, "signature": sign_summary(KEY, summary)},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert pushed.status_code == 200, pushed.text
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
