"""Regions behind the global service whose answers a test chooses: an httpx transport
standing in for each region's service, and three registered regions (cheap, mid, dear)
with one free H100 box each (the ``regions`` fixture, tests/service/federation/conftest.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx
from fastapi.testclient import TestClient

from agent.signing import NodeKey
from service.federation.schemas import RegionSummary
from service.federation.signing import sign_summary

KEY = NodeKey.generate()
# Cheapest first: the ranking tries cheap, then mid, then dear.
PRICES = {"cheap": 1.0, "mid": 2.0, "dear": 3.0}

Answer = Callable[[httpx.Request], httpx.Response]


def allocation(region: str, replayed: bool = False) -> httpx.Response:
    # The job test_routing.place() asks for: one task of two GPUs.
    gpus = ["GPU-0", "GPU-1"]
    body = {"id": f"alloc-{region}", "tasks": [{"node": f"{region}-n1", "gpu_uuids": gpus}]}
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    return httpx.Response(200 if replayed else 201, json=body, headers=headers)


def answering(region: str, replayed: bool = False) -> Answer:
    """A region that places every request."""
    return lambda request: allocation(region, replayed)


class Regions:
    """What each region answers, and the requests each got."""

    def __init__(self) -> None:
        self.answers: dict[str, Answer] = {}
        self.seen: list[tuple[str, str | None, dict[str, Any]]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        region = request.url.host.split(".")[0]
        self.seen.append(
            (region, request.headers.get("idempotency-key"), json.loads(request.content))
        )
        return self.answers[region](request)


def free_h100_node(design: str) -> dict[str, Any]:
    """A summary's design line: one idle 8-GPU H100 node, one NVLink island of 8."""
    return {
        "design": design,
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpus_per_node": 8,
        "nodes": 1,
        "free_gpus": 8,
        "island_gbps": 450.0,
        "by_island": {"8": 1},
    }


def add_region(client: TestClient, name: str, price: float) -> None:
    """Register a region selling H100s at ``price`` and push its summary: one free box."""
    created = client.post(
        "/v1/regions",
        json={
            "name": name,
            "cloud": "aws",
            "url": f"http://{name}.example",
            "public_key": KEY.public_key,
            "prices": [{"gpu_model": "H100", "on_demand": price}],
            "egress": {"region_gb": 0.0, "internet_gb": 0.0},
        },
    )
    assert created.status_code == 201, created.text
    summary = RegionSummary.model_validate(
        {
            "region": name,
            "seq": time.time_ns(),
            "sent_at": datetime.now(UTC),
            "designs": [free_h100_node("H100 x8")],
        }
    ).model_dump(mode="json")
    pushed = client.put(
        f"/v1/regions/{name}/summary",
        json={"summary": summary, "signature": sign_summary(KEY, summary)},
        headers={"Authorization": f"Bearer {created.json()['token']}"},
    )
    assert pushed.status_code == 200, pushed.text
