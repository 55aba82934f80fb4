"""Reliability: how fast replicas follow each other, and a chaos run.

Three `topoplace serve` processes on one fresh Postgres database, 16
simulated HGX H100 nodes, real HTTP on loopback.

1. **Replica lag.** Replica A places (then releases) all 8 GPUs of a node;
   the clock stops when replica B's own view shows the change (B is polled
   back to back over HTTP, so the figure includes up to one poll). Printed
   beside the floor measured in the same run: a bare Postgres NOTIFY heard
   by a LISTENing connection.
2. **Chaos** (``--chaos``; stops and starts the local Postgres, so run it
   on a machine of its own): 32 clients place and release for 40 s, each
   retrying a failed call on the next replica with the same
   Idempotency-Key, as a scheduler would. At 10 s one replica is killed
   (SIGKILL) and started again 5 s later; at 22 s Postgres is stopped for 5
   s. Afterwards: no GPU in two live allocations, every live allocation
   holds exactly its devices, no acknowledged allocation lost, one
   allocation per key, every replica's view equals the database, and every
   503 carried Retry-After and came while the database was down.

Run: ``python -m bench.reliability [--chaos] [--samples N]``;
TOPOPLACE_BENCH_DATABASE_URL names the Postgres server (default: the local
one). Results: docs/reliability.md.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import httpx
import psycopg
import sqlalchemy as sa

from bench.machine import describe
from bench.service_speed import DEFAULT_URL, fresh_database, ms
from placement.profiles import build_profile
from service import migrate
from service.notify import psycopg_dsn
from tests.service import replica_processes
from tests.service.invariant import database_view, replica_view

NODES = 16
ENV = {"TOPOPLACE_HEARTBEAT_TTL_S": "3600", "TOPOPLACE_RESERVATION_TTL_S": "5"}


def register(url: str) -> list[str]:
    names = []
    with httpx.Client(base_url=url, trust_env=False) as client:
        for i in range(NODES):
            snap = build_profile("hgx-h100", f"h100-{i:02d}")
            body = {"snapshot": snap.model_dump(mode="json")}
            client.put(f"/v1/nodes/{snap.name}/snapshot", json=body).raise_for_status()
            names.append(snap.name)
    return names


def _until(client: httpx.Client, node: str, free: int, limit_s: float = 5.0) -> float:
    start = time.perf_counter()
    while len(client.get(f"/v1/nodes/{node}").json()["free_gpus"]) != free:
        if time.perf_counter() - start > limit_s:
            raise TimeoutError(f"{node} did not show {free} free GPUs")
    return time.perf_counter()


def replica_lag(urls: list[str], node: str, samples: int) -> tuple[list[float], list[float]]:
    placed, released = [], []
    with (
        httpx.Client(base_url=urls[0], trust_env=False) as a,
        httpx.Client(base_url=urls[1], trust_env=False) as b,
    ):
        _until(b, node, 8)
        for _ in range(samples):
            response = a.post("/v1/place", json={"gpus": 8, "nodes": [node]})
            committed = time.perf_counter()
            response.raise_for_status()
            placed.append(_until(b, node, 0) - committed)
            a.post(f"/v1/allocations/{response.json()['id']}/release").raise_for_status()
            committed = time.perf_counter()
            released.append(_until(b, node, 8) - committed)
    return placed, released


def notify_floor(database_url: str, samples: int) -> list[float]:
    dsn = psycopg_dsn(database_url)
    out = []
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as sender,
    ):
        listener.execute("LISTEN bench_floor")
        for i in range(samples):
            start = time.perf_counter()
            sender.execute("SELECT pg_notify('bench_floor', %s)", (str(i),))
            next(listener.notifies(timeout=5, stop_after=1))
            out.append(time.perf_counter() - start)
    return out


@dataclass
class ChaosLog:
    acknowledged: dict[str, str] = field(default_factory=dict)  # key -> allocation id
    statuses: Counter[int] = field(default_factory=Counter)
    transport_errors: int = 0
    unavailable: list[tuple[float, bool]] = field(default_factory=list)  # (time, Retry-After)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _client_loop(urls: list[str], worker: int, until: float, log: ChaosLog) -> None:
    rng = random.Random(worker)
    clients = [httpx.Client(base_url=u, timeout=10.0, trust_env=False) for u in urls]
    mine: list[str] = []
    serial = 0
    try:
        while time.monotonic() < until:
            serial += 1
            key = f"w{worker}-{serial}"
            body = {"gpus": rng.choice([1, 2, 4]), "job_id": key, "ttl_s": 3}
            for attempt in range(len(urls) * 2):
                client = clients[(worker + attempt) % len(clients)]
                try:
                    response = client.post("/v1/place", json=body, headers={"Idempotency-Key": key})
                except httpx.TransportError:
                    with log.lock:
                        log.transport_errors += 1
                    time.sleep(0.05)
                    continue
                with log.lock:
                    log.statuses[response.status_code] += 1
                    if response.status_code == 503:
                        log.unavailable.append(
                            (time.monotonic(), "retry-after" in response.headers)
                        )
                if response.status_code in (200, 201):
                    allocation = str(response.json()["id"])
                    with log.lock:
                        log.acknowledged[key] = allocation
                    mine.append(allocation)
                    break
                if response.status_code == 503:
                    time.sleep(0.1)
                    continue
                break
            if mine and rng.random() < 0.5:
                allocation = mine.pop(rng.randrange(len(mine)))
                client = clients[rng.randrange(len(clients))]
                try:
                    response = client.post(f"/v1/allocations/{allocation}/release")
                    with log.lock:
                        log.statuses[response.status_code] += 1
                        if response.status_code == 503:
                            log.unavailable.append(
                                (time.monotonic(), "retry-after" in response.headers)
                            )
                except httpx.TransportError:
                    with log.lock:
                        log.transport_errors += 1
            time.sleep(0.02)
    finally:
        for client in clients:
            client.close()


def _postgres(action: str) -> None:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    command = ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", action]
    if action == "stop":
        command += ["-m", "fast"]
    subprocess.run(command, check=True, capture_output=True)


def chaos(database_url: str, urls: list[str], running: replica_processes.Running) -> None:
    log = ChaosLog()
    start = time.monotonic()
    until = start + 40.0
    down: list[tuple[float, float]] = []
    with ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(_client_loop, urls, w, until, log) for w in range(32)]
        time.sleep(10)
        victim = running.procs[2]
        victim.kill()
        victim.wait()
        print("  10 s: replica 3 killed")
        time.sleep(5)
        port = int(urls[2].rsplit(":", 1)[1])
        url, restarted = replica_processes.start(database_url, ENV, port=port)
        running.procs[2] = restarted
        replica_processes.wait_ready(url, restarted)
        print(f"  {time.monotonic() - start:.0f} s: replica 3 started again and ready")
        time.sleep(max(0.0, start + 22 - time.monotonic()))
        stopped = time.monotonic()
        _postgres("stop")
        print(f"  {stopped - start:.0f} s: Postgres stopped")
        time.sleep(5)
        _postgres("start")
        down.append((stopped, time.monotonic()))
        print(f"  {time.monotonic() - start:.0f} s: Postgres started")
        for future in futures:
            future.result()
    print(
        f"  answers: {dict(sorted(log.statuses.items()))}, transport errors {log.transport_errors}"
    )
    late = [t for t, _ in log.unavailable if not any(a <= t <= b + 1.0 for a, b in down)]
    bare = sum(1 for _, has in log.unavailable if not has)
    print(f"  503s: {len(log.unavailable)}, outside the outage (+1 s): {len(late)},", end=" ")
    print(f"without Retry-After: {bare}")
    engine = sa.create_engine(database_url)
    deadline = time.monotonic() + 10
    while True:  # every replica converges on the database (the check of the property test)
        held, states = database_view(engine)
        views = [replica_view(httpx.Client(base_url=u, trust_env=False)) for u in urls]
        if all(v == held for v in views) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    lost = [k for k, i in log.acknowledged.items() if i not in states]
    with engine.connect() as conn:
        keys = conn.execute(
            sa.text("SELECT count(*), count(DISTINCT idempotency_key) FROM allocations")
        ).one()
    engine.dispose()
    print(f"  acknowledged: {len(log.acknowledged)}, lost: {len(lost)}")
    print(f"  allocations {keys[0]}, distinct keys {keys[1]}; GPUs held now {len(held)}")
    print(f"  replicas equal to the database: {[v == held for v in views]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--chaos", action="store_true")
    args = parser.parse_args()
    base = os.environ.get("TOPOPLACE_BENCH_DATABASE_URL", DEFAULT_URL)
    print(f"machine: {describe()}")
    with fresh_database(base) as url:
        migrate.upgrade(url)
        with replica_processes.replicas(url, 3, ENV) as running:
            urls = running.urls
            names = register(urls[0])
            placed, released = replica_lag(urls, names[0], args.samples)
            floor = notify_floor(url, args.samples)
            print(f"replica lag, {args.samples} samples (ms, p50 / p99):")
            for label, values in (("place", placed), ("release", released), ("bare NOTIFY", floor)):
                print(f"  {label:12s} {ms(values, 50):6.2f} / {ms(values, 99):6.2f}")
            print(f"  place p99 / NOTIFY p99: {ms(placed, 99) / ms(floor, 99):.1f}x")
            if args.chaos:
                print("chaos run, 40 s:")
                chaos(url, urls, running)


if __name__ == "__main__":
    main()
