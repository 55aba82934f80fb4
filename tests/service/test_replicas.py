"""Two service processes on one Postgres never hand out a GPU twice.

Real processes (`topoplace serve`), real HTTP over loopback, real Postgres:
hundreds of concurrent /place calls from many clients spread over both
replicas until the cluster is full; then every success must be in the
database, no GPU may be held twice, and each replica's view must converge
on what the other one did.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from placement.profiles import build_profile
from service import schema
from tests.service import replica_processes
from tests.service.conftest import _truncate

FLEET = [("hgx-h100", 8), ("dgx1-v100", 6), ("pcie-8x-l40s", 4)]


@pytest.fixture
def replicas(postgres_url: str) -> Iterator[list[str]]:
    _truncate(postgres_url)
    env = {"TOPOPLACE_HEARTBEAT_TTL_S": "3600", "TOPOPLACE_RESERVATION_TTL_S": "3600"}
    with replica_processes.replicas(postgres_url, 2, env) as running:
        yield running.urls


def _eventually(check: Any, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while True:
        if check():
            return
        if time.monotonic() > end:
            raise AssertionError("replicas did not converge in time")
        time.sleep(0.1)


def test_concurrent_place_on_two_replicas(replicas: list[str], postgres_url: str) -> None:
    a, b = replicas
    names = []
    for profile, count in FLEET:
        for i in range(count):
            snap = build_profile(profile, f"{profile}-{i}")
            body = {"snapshot": snap.model_dump(mode="json")}
            assert httpx.put(f"{a}/v1/nodes/{snap.name}/snapshot", json=body).status_code == 200
            names.append(snap.name)
    total_gpus = sum(8 * count for _, count in FLEET)

    # B learns the nodes A received through Postgres notifications.
    _eventually(lambda: len(httpx.get(f"{b}/v1/nodes").json()["nodes"]) == len(names))

    rng = random.Random(7)
    sizes = [rng.choice([1, 1, 2, 2, 4]) for _ in range(400)]

    # One pooled client per replica, shared by 24 threads, like a scheduler's workers.
    limits = httpx.Limits(max_connections=32)
    clients = [httpx.Client(base_url=url, timeout=30.0, limits=limits) for url in replicas]

    def place(i: int) -> httpx.Response:
        body = {"gpus": sizes[i], "job_id": f"job-{i}"}
        return clients[i % 2].post("/v1/place", json=body)

    try:
        with ThreadPoolExecutor(max_workers=24) as pool:
            responses = list(pool.map(place, range(len(sizes))))
    finally:
        for client in clients:
            client.close()

    statuses = {r.status_code for r in responses}
    assert statuses <= {201, 409}, [r.text for r in responses if r.status_code not in (201, 409)]
    placed = [r.json() for r in responses if r.status_code == 201]
    held = [
        (task["node"], gpu)
        for alloc in placed
        for task in alloc["tasks"]
        for gpu in task["gpu_uuids"]
    ]
    assert len(held) == len(set(held)), "a GPU was handed out twice"
    # 400 requests ask for about 5x the cluster: it must end (nearly) full,
    # with the 1-GPU requests late in the run taking the last free GPUs.
    assert total_gpus - 2 <= len(held) <= total_gpus
    for r in responses:
        if r.status_code == 409:
            assert r.json()["error"]["code"] == "unschedulable"

    engine = sa.create_engine(postgres_url)
    with engine.connect() as conn:
        rows = conn.execute(sa.select(schema.gpu_holds.c.node, schema.gpu_holds.c.device)).all()
        ids = set(conn.execute(sa.select(schema.allocations.c.id)).scalars())
    engine.dispose()
    assert {(str(n), str(d)) for n, d in rows} == set(held)
    assert {alloc["id"] for alloc in placed} == ids

    # Release half through B; A must see those GPUs free again.
    for alloc in placed[::2]:
        assert httpx.post(f"{b}/v1/allocations/{alloc['id']}/release").status_code == 200
    still = sum(len(t["gpu_uuids"]) for alloc in placed[1::2] for t in alloc["tasks"])

    def a_sees_releases() -> bool:
        nodes = httpx.get(f"{a}/v1/nodes").json()["nodes"]
        return sum(len(n["free_gpus"]) for n in nodes) == total_gpus - still

    _eventually(a_sees_releases)
