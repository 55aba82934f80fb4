"""Service speed: /place over HTTP on loopback with Postgres commits, and /score.

One `topoplace serve` process on a fresh Postgres database holding 1,000 or
10,000 simulated nodes (the engine benchmark's mixed fleet, written straight
into the database and loaded by the service on start). Measured:

1. /place at a fixed offered load of 200 requests/s for 10 s (open loop:
   latency counts from the moment a request was due, so queueing shows);
2. saturation: 32 clients sending /place back to back for 10 s;
3. /score restricted to 500 named nodes (the Kubernetes extender's shape),
   sequential, 1,000 samples (a p99 of 200 rested on its two worst).

Each is printed with the engine's own in-process `place()` time on the same
cluster, so the cost of HTTP, JSON and the database commit is visible.

Needs a Postgres server: TOPOPLACE_BENCH_DATABASE_URL, else the local one
(postgresql+psycopg://postgres@127.0.0.1:5432/postgres). Run:
``python -m bench.service_speed [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np
import sqlalchemy as sa

from bench.engine_speed import build_cluster
from bench.http_load import LoadResult, encode_post, fixed_rate, in_sequence, saturate
from bench.machine import StealMeter, describe
from placement import ClusterState, PlacementRequest
from service import migrate, schema

DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
RESERVATION_TTL_S = 1
SCORE_SAMPLES = 1_000


@contextmanager
def fresh_database(base: str) -> Iterator[str]:
    name = f"topoplace_bench_{uuid.uuid4().hex[:8]}"
    # Pre-ping: bench.reliability restarts Postgres while this engine waits to drop.
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def seed(url: str, state: ClusterState) -> None:
    migrate.upgrade(url)
    now = datetime.now(UTC)
    rows = [
        {
            "name": entry.name,
            "region": entry.snapshot.region,
            "snapshot": entry.snapshot.model_dump_json(),
            "seq": entry.snapshot.seq,
            "signature": None,
            "cordoned": False,
            "reported_at": now,
            "heartbeat_at": now,
        }
        for entry in state.nodes()
    ]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.nodes), rows)
    engine.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def serve(url: str, grpc_port: int | None = None) -> Iterator[tuple[str, int]]:
    """One `topoplace serve` process, REST only unless a gRPC port is given: (base URL, pid)."""
    port = free_port()
    grpc_args = ["--grpc-port", str(grpc_port)] if grpc_port is not None else ["--no-grpc"]
    env = {
        **os.environ,
        "TOPOPLACE_DATABASE_URL": url,
        "TOPOPLACE_HEARTBEAT_TTL_S": "86400",
        # Reservations expire after a few seconds (the sweeper's work is part of
        # the measurement) so that minutes of load never fill the cluster.
        "TOPOPLACE_RESERVATION_TTL_S": str(RESERVATION_TTL_S),
        # A measurement of placement, not of tokens: no client here sends one.
        "TOPOPLACE_INSECURE_DEV": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "topoplace",
            "serve",
            "--port",
            str(port),
            "--no-migrate",
            *grpc_args,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise TimeoutError("service did not become ready")
        yield base, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def _request(rng: random.Random) -> dict[str, object]:
    return {"gpus": rng.choice([1, 1, 2, 4]), "job_id": f"bench-{rng.randrange(10**9)}"}


# One /place call over some transport: takes the REST JSON body, says whether it placed.
Send = Callable[[dict[str, object]], bool]
MakeBody = Callable[[random.Random], dict[str, object]]


def rest_sender(client: httpx.Client) -> Send:
    return lambda body: client.post("/v1/place", json=body).status_code == 201


def open_loop(
    send: Send, rate: float, seconds: float, make_body: MakeBody = _request
) -> tuple[list[float], int]:
    """Open loop: request i is due at i / rate; latency is measured from that moment."""
    total = int(rate * seconds)
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    start = time.perf_counter() + 0.2
    rng = random.Random(1)
    bodies = [make_body(rng) for _ in range(total)]

    def worker(offset: int, stride: int) -> None:
        nonlocal errors
        for i in range(offset, total, stride):
            due = start + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            placed = send(bodies[i])
            done = time.perf_counter()
            with lock:
                latencies.append(done - due)
                errors += not placed

    threads = [threading.Thread(target=worker, args=(k, 32)) for k in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, errors


def closed_loop(
    send: Send, seconds: float, clients: int = 32, make_body: MakeBody = _request
) -> tuple[float, int]:
    """``clients`` callers back to back for ``seconds``: requests per second, failures."""
    stop = time.perf_counter() + seconds
    done = 0
    errors = 0
    lock = threading.Lock()

    def worker(seed_: int) -> None:
        nonlocal done, errors
        rng = random.Random(seed_)
        while time.perf_counter() < stop:
            placed = send(make_body(rng))
            with lock:
                done += 1
                errors += not placed

    begin = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return done / (time.perf_counter() - begin), errors


def _place_body(rng: random.Random) -> bytes:
    return json.dumps(_request(rng)).encode()


def fixed_load(base: str, rate: float, seconds: float) -> LoadResult:
    """Open loop at ``rate``: latency counts from when each request was due."""
    rng = random.Random(1)
    bodies = [encode_post(base, "/v1/place", _place_body(rng)) for _ in range(int(rate * seconds))]
    return fixed_rate(base, bodies, rate)


def saturation(base: str, seconds: float, clients: int = 32) -> LoadResult:
    rng = random.Random(2)
    return saturate(
        base, lambda _: encode_post(base, "/v1/place", _place_body(rng)), seconds, clients
    )


def score_latency(base: str, names: list[str], samples: int) -> list[float]:
    """/score of ``names``, with a /place between samples so the cluster keeps changing
    (a scheduler scores pod after pod while the previous ones bind)."""
    rng = random.Random(3)
    score = encode_post(base, "/v1/score", json.dumps({"gpus": 4, "nodes": names}).encode())
    sent: list[bytes] = []
    for _ in range(samples):
        sent += [encode_post(base, "/v1/place", _place_body(rng)), score]
    answers = in_sequence(base, sent)
    assert all(status in (200, 201) for _, status in answers), "a request failed"
    return [latency for latency, _ in answers[1::2]]


def engine_time(state: ClusterState, decisions: int) -> float:
    rng = random.Random(2)
    times = []
    for _ in range(decisions):
        body = _request(rng)
        request = PlacementRequest(gpus=int(str(body["gpus"])))
        t0 = time.perf_counter()
        state.place(request)
        times.append(time.perf_counter() - t0)
    return float(np.mean(times))


def ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) * 1e3


def score_cpu(base: str, pid: int, names: list[str], samples: int) -> float:
    """The service's CPU milliseconds per /score of ``names`` (nothing else running in it)."""
    body = encode_post(base, "/v1/score", json.dumps({"gpus": 4, "nodes": names}).encode())
    cpu0 = cpu_seconds(pid)
    in_sequence(base, [body] * samples)
    return (cpu_seconds(pid) - cpu0) / samples * 1e3


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used: unlike throughput, it does not
    depend on what else the machine runs, so it shows the service's own cost."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def evaluate_time(state: ClusterState, names: list[str], samples: int) -> list[float]:
    """Seconds per ``evaluate`` of a 4-GPU request over ``names``, after one warm-up."""
    request = PlacementRequest(gpus=4, nodes=tuple(names))
    state.evaluate(request)  # the first call builds the class tables
    out = []
    for _ in range(samples):
        t0 = time.perf_counter()
        state.evaluate(request)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    base_url = os.environ.get("TOPOPLACE_BENCH_DATABASE_URL", DEFAULT_URL)
    print(f"machine: {describe()}")
    seconds = 3.0 if args.quick else 10.0
    print(
        "\n| nodes | offered req/s | p50 ms | p99 ms | non-201 | saturation req/s (32 clients)"
        " | service CPU ms per /place | engine place() ms | HTTP+DB / engine (p50)"
        " | CPU steal % (at 200 req/s) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    score_rows = []
    for size in (1_000,) if args.quick else (1_000, 10_000):
        state = build_cluster(size, seed=size)
        names = state.names()[:500]
        with fresh_database(base_url) as url:
            seed(url, state)
            with serve(url) as (base, pid):
                steal = StealMeter()
                fixed = fixed_load(base, 200.0, seconds)
                fixed_steal = steal.percent()
                cpu0 = cpu_seconds(pid)
                sat = saturation(base, seconds)
                cpu_ms = (cpu_seconds(pid) - cpu0) / len(sat.statuses) * 1e3
                # Let the saturation's reservations expire first: their sweeps belong to
                # the /place figures above, not to /score's.
                time.sleep(RESERVATION_TTL_S + 1.0)
                steal = StealMeter()
                scores = score_latency(base, names, 50 if args.quick else SCORE_SAMPLES)
                score_steal = steal.percent()
                score_cpu_ms = score_cpu(base, pid, names, 50)
        engine_ms = engine_time(state, 500) * 1e3
        lat = fixed.latencies
        print(
            f"| {size:,} | 200 | {ms(lat, 50):.1f} | {ms(lat, 99):.1f} | {fixed.non(201)} "
            f"| {sat.rate:,.0f} ({sat.non(201)} non-201) | {cpu_ms:.2f} | {engine_ms:.3f} "
            f"| {ms(lat, 50) / engine_ms:,.0f}x | {fixed_steal:.1f} |"
        )
        inner = evaluate_time(state, names, 50)
        score_rows.append(
            f"| {size:,} | 500 | {ms(scores, 50):.1f} | {ms(scores, 99):.1f} | {score_cpu_ms:.2f}"
            f" | {ms(inner, 50):.2f} | {ms(scores, 50) / ms(inner, 50):.1f}x | {score_steal:.1f} |"
        )
    print(
        "\n| cluster nodes | nodes scored | /score p50 ms | /score p99 ms"
        " | service CPU ms per /score | engine evaluate() p50 ms | HTTP / engine (p50)"
        " | CPU steal % |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(score_rows))


if __name__ == "__main__":
    main()
