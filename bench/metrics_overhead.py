"""What /metrics' request middleware costs a /place: p50 with it and without it.

Two `topoplace serve`-like processes on loopback, each on a SQLite database
of its own holding the same 100 HGX H100 nodes; one runs the service as it
ships, the other with the request middleware (service/metrics/http.py)
taken out. Each round sends 400 /place calls one after another on one
connection (each followed by its job's release, so the cluster never fills)
to one process, then to the other; rounds alternate, so that drift of a
shared machine lands on both. Printed: /place p50 and p99 of each, and
their ratio, and the middleware's own time per request measured in-process
around an ASGI app that does nothing, and what a scrape of 10,000 nodes
costs: the median and longest hold of the state lock, the first scrape (designs
worked out) and the next.

Run: ``python -m bench.metrics_overhead [--rounds N]``; ports 24100-24101.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import httpx
import numpy as np

from bench.engine_speed import build_cluster
from bench.http_load import encode_post, in_sequence
from bench.machine import StealMeter, describe
from placement.profiles import build_profile
from service.metrics.cluster import ClusterCollector
from service.metrics.http import RequestMetrics
from service.metrics.registry import Metrics

NODES = 100
PER_ROUND = 400
PORTS = {"with": 24100, "without": 24101}


def serve(database: str, port: int, without: bool) -> None:
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    # No agents heartbeat here: the nodes must not turn stale during the run.
    settings = Settings(
        database_url=f"sqlite:///{database}",
        insecure_dev=True,
        grpc_port="off",
        heartbeat_ttl_s=86_400,
    )
    app = create_app(settings)
    if without:
        kept = [m for m in app.user_middleware if cast(object, m.cls) is not RequestMetrics]
        app.user_middleware = kept
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _start(tmp: Path, kind: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "bench.metrics_overhead", "--serve", str(tmp / f"{kind}.db")]
    command += ["--port", str(PORTS[kind])] + (["--without"] if kind == "without" else [])
    proc = subprocess.Popen(command)
    base = f"http://127.0.0.1:{PORTS[kind]}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/readyz", trust_env=False).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    for i in range(NODES):
        snap = build_profile("hgx-h100", f"h100-{i}").model_dump(mode="json")
        put = httpx.put(f"{base}/v1/nodes/h100-{i}/snapshot", json={"snapshot": snap})
        put.raise_for_status()
    return proc


def _round(base: str, start: int) -> list[float]:
    requests = []
    for i in range(start, start + PER_ROUND):
        body = json.dumps({"gpus": 1, "job_id": f"j{i}"}).encode()
        requests.append(encode_post(base, "/v1/place", body))
        requests.append(encode_post(base, f"/v1/jobs/j{i}/release", b"{}"))
    answers = in_sequence(base, requests)
    places = answers[0::2]
    assert all(status == 201 for _, status in places), {s for _, s in places}
    return [latency for latency, _ in places]


def middleware_alone(samples: int = 20_000) -> float:
    """Microseconds the middleware adds around an app that answers at once."""

    async def nothing(scope: object, receive: object, send: object) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"{}"})  # type: ignore[operator]

    async def sink(message: object) -> None:
        return None

    async def receive() -> dict[str, object]:
        return {"type": "http.request"}

    wrapped = RequestMetrics(nothing, Metrics())
    scope = {"type": "http", "method": "POST", "path": "/v1/place", "root_path": ""}

    async def run(app: object) -> float:
        t0 = time.perf_counter()
        for _ in range(samples):
            await app(dict(scope), receive, sink)  # type: ignore[operator]
        return (time.perf_counter() - t0) / samples

    bare = min(asyncio.run(run(nothing)) for _ in range(3))
    timed = min(asyncio.run(run(wrapped)) for _ in range(3))
    return (timed - bare) * 1e6


def scrape_cost(nodes: int = 10_000) -> tuple[float, float, float, float]:
    """(median and longest hold of the state lock, first scrape, next scrape) in ms, for
    the node gauges over the engine benchmark's mixed fleet of ``nodes`` nodes."""
    cluster = build_cluster(nodes, 1)
    held: list[float] = []

    class TimedLock:
        def __enter__(self) -> None:
            self.t0 = time.perf_counter()

        def __exit__(self, *_: object) -> None:
            held.append(time.perf_counter() - self.t0)

    state = SimpleNamespace(cluster=cluster, lock=TimedLock(), cordoned=set(), is_stale=bool)
    collector = ClusterCollector(state)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    collector._groups()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    collector._groups()
    second = time.perf_counter() - t0
    holds = held[1:]  # [0]: reading the names
    return statistics.median(holds) * 1e3, max(holds) * 1e3, first * 1e3, second * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--serve", metavar="DATABASE")
    parser.add_argument("--port", type=int)
    parser.add_argument("--without", action="store_true")
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.without)
        return
    print(f"machine: {describe()}")
    latencies: dict[str, list[float]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory() as tmp:
        procs = [_start(Path(tmp), kind) for kind in PORTS]
        try:
            for kind in PORTS:  # warm both
                _round(f"http://127.0.0.1:{PORTS[kind]}", 10**6)
            steal = StealMeter()
            for r in range(args.rounds):
                order = list(PORTS) if r % 2 == 0 else list(reversed(PORTS))
                for kind in order:
                    base = f"http://127.0.0.1:{PORTS[kind]}"
                    latencies[kind] += _round(base, r * PER_ROUND)
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(timeout=30)
    p50 = {k: float(np.percentile(v, 50)) * 1e3 for k, v in latencies.items()}
    p99 = {k: float(np.percentile(v, 99)) * 1e3 for k, v in latencies.items()}
    print(f"/place, {len(latencies['with'])} sequential calls each, {NODES} HGX H100 nodes, SQLite")
    for kind in PORTS:
        print(f"  {kind:>7} the middleware: p50 {p50[kind]:.3f} ms, p99 {p99[kind]:.3f} ms")
    print(f"  p50 ratio with / without: {p50['with'] / p50['without']:.3f}")
    print(f"  per-round p50 (with): {[round(x, 3) for x in _per_round(latencies['with'])]}")
    print(f"  per-round p50 (without): {[round(x, 3) for x in _per_round(latencies['without'])]}")
    print(f"middleware alone: {middleware_alone():.2f} us per request")
    median, longest, first, second = scrape_cost()
    print(
        f"scrape of 10,000 nodes: state-lock hold median {median:.2f} ms, longest"
        f" {longest:.2f} ms; first scrape {first:.0f} ms, next {second:.0f} ms"
    )
    print(f"steal: {steal.percent():.1f}%")


def _per_round(values: list[float]) -> list[float]:
    return [
        statistics.median(values[i : i + PER_ROUND]) * 1e3 for i in range(0, len(values), PER_ROUND)
    ]


if __name__ == "__main__":
    main()
