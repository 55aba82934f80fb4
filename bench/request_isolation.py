"""One request never harms another: the stall a large legal request causes its neighbours.

One `topoplace serve` process (REST, loopback HTTP) on a fresh Postgres
database holding 10,000 simulated nodes (the engine benchmark's fleet). A
probe sends a small /v1/score (8 named nodes, 1 GPU) every 5 ms on its own
connection while another connection sends one kind of heavy request back to
back; the probe's latency during the heavy phase is the stall the heavy
request causes everyone else on the replica. Printed per kind: the heavy
request's status, and the probe's p50 / p99 / max, against a phase with no
heavy request.

Needs a Postgres server: TOPOPLACE_BENCH_DATABASE_URL, else the local one.
Run: ``python -m bench.request_isolation [--seconds S]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from urllib.parse import urlsplit

import numpy as np

from bench.engine_speed import build_cluster
from bench.http_load import _Connection, encode_post
from bench.machine import describe
from bench.service_speed import DEFAULT_URL, fresh_database, seed, serve
from placement.request import MAX_NODE_NAMES

NODES = 10_000
PROBE_EVERY_S = 0.005


def _names_of_bytes(size: int, prefix: str) -> list[str]:
    """About ``size`` bytes of distinct JSON-encoded node names."""
    out: list[str] = []
    used = 0
    while used < size:
        name = f"{prefix}-{len(out):07d}"
        out.append(name)
        used += len(name) + 3
    return out


def _dumps(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def heavy_kinds(names: list[str]) -> dict[str, tuple[str, bytes]]:
    """Each heavy request: (path, body), legal before the bounds."""
    four_mb = 4 * 1024 * 1024 - 4096
    unknown = _names_of_bytes(four_mb, "x")
    many = [names[i % len(names)] for i in range(180_000)]
    return {
        "place exclude_nodes 4 MB": (
            "/v1/place",
            _dumps({"gpus": 1, "ttl_s": 1, "exclude_nodes": unknown}),
        ),
        "score nodes 4 MB": ("/v1/score", _dumps({"gpus": 1, "nodes": unknown})),
        "score paged 180k nodes": (
            "/v1/score?limit=1000",
            _dumps({"gpus": 1, "nodes": many}),
        ),
        "place exclude_nodes 65,536 names (the bound)": (
            "/v1/place",
            _dumps({"gpus": 1, "ttl_s": 1, "exclude_nodes": unknown[:MAX_NODE_NAMES]}),
        ),
        "score paged 65,536 nodes (the bound)": (
            "/v1/score?limit=1000",
            _dumps({"gpus": 1, "nodes": many[:MAX_NODE_NAMES]}),
        ),
        "place gang 4096 x 1 GPU": (
            "/v1/place",
            _dumps({"gpus": 1, "tasks": 4096, "ttl_s": 1, "locality": "any"}),
        ),
    }


async def _connect(base: str) -> _Connection:
    parts = urlsplit(base)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    return _Connection(reader, writer)


async def phase(base: str, heavy: tuple[str, bytes] | None, seconds: float, probe: bytes) -> str:
    probe_conn = await _connect(base)
    loop = asyncio.get_running_loop()
    stop = loop.time() + seconds
    latencies: list[float] = []
    statuses: set[int] = set()
    heavy_times: list[float] = []

    async def probing() -> None:
        while loop.time() < stop:
            t0 = loop.time()
            status = await probe_conn.exchange(probe)
            assert status == 200, status
            latencies.append(loop.time() - t0)
            await asyncio.sleep(PROBE_EVERY_S)

    async def loading() -> None:
        if heavy is None:
            return
        request = encode_post(base, heavy[0], heavy[1])
        while loop.time() < stop:
            # A connection per request: a refused body (413) closes its connection.
            conn = await _connect(base)
            t0 = loop.time()
            statuses.add(await conn.exchange(request))
            heavy_times.append(loop.time() - t0)
            conn.close()
            await asyncio.sleep(0.05)  # leave the probe some quiet time between heavies

    await asyncio.gather(probing(), loading())
    probe_conn.close()
    ms = np.array(latencies) * 1e3
    heavy_ms = f"{np.median(heavy_times) * 1e3:.0f}" if heavy_times else "-"
    return (
        f"| {sorted(statuses) or '-'} | {len(heavy_times)} | {heavy_ms} | "
        f"{np.percentile(ms, 50):.1f} | {np.percentile(ms, 99):.1f} | {ms.max():.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    print(f"machine: {describe()}")
    state = build_cluster(NODES, seed=NODES)
    names = state.names()
    probe = _dumps({"gpus": 1, "nodes": names[:8]})
    with fresh_database(os.environ.get("TOPOPLACE_BENCH_DATABASE_URL", DEFAULT_URL)) as url:
        seed(url, state)
        with serve(url) as (base, _pid):
            probe_request = encode_post(base, "/v1/score", probe)
            print(
                "\n| heavy request | its statuses | sent | its ms (p50) | probe p50 ms"
                " | probe p99 ms | probe max ms |"
            )
            print("|---|---|---|---|---|---|---|")
            kinds: dict[str, tuple[str, bytes] | None] = {"none": None}
            kinds.update(heavy_kinds(names))
            for label, heavy in kinds.items():
                row = asyncio.run(phase(base, heavy, args.seconds, probe_request))
                print(f"| {label} {row}", flush=True)
                time.sleep(1.5)  # the gang's reservations expire before the next kind


if __name__ == "__main__":
    main()
