"""MIG pools under racing schedulers: three `topoplace serve` processes on one Postgres.

Threads place MIG instances through any replica (some with a TTL short enough for
the replicas' own sweeps to expire them), release them, and report Slurm jobs said
to run on the node's GPUs whole (the prolog's truth, which supersedes the holders of
their instances), all at once. Afterwards the database holds each GPU at most once,
whole or through instances, and each MIG pool counts exactly its GPU's instances
(tests/service/invariant.py); no answer was a 5xx.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import sqlalchemy as sa

from placement.profiles import build_profile
from tests.service import replica_processes
from tests.service.conftest import _truncate
from tests.service.invariant import database_view
from tests.service.slurm.test_truth import show_job

pytestmark = pytest.mark.slow

REPLICAS = 3
THREADS = 6
STEPS = 25
NODE = "m0"
ENV = {"TOPOPLACE_HEARTBEAT_TTL_S": "3600", "TOPOPLACE_MIN_RESERVATION_TTL_S": "0.1"}
PROFILES = ("1g.10gb", "2g.20gb", "3g.40gb")


def test_instances_and_whole_gpus_racing_on_three_replicas_keep_the_pools(
    postgres_url: str,
) -> None:
    _truncate(postgres_url)
    snap = build_profile("hgx-h100-mig", NODE)
    with replica_processes.replicas(postgres_url, REPLICAS, ENV) as running:
        clients = [httpx.Client(base_url=u, timeout=30.0, trust_env=False) for u in running.urls]
        body = {"snapshot": snap.model_dump(mode="json")}
        assert clients[0].put(f"/v1/nodes/{NODE}/snapshot", json=body).status_code == 200
        time.sleep(1.0)  # every replica hears of the node
        held: list[str] = []
        lock = threading.Lock()
        jobs = iter(range(1000, 100_000))
        answers: list[tuple[str, int, str]] = []

        def step(rng: random.Random) -> None:
            client = rng.choice(clients)
            roll = rng.random()
            if roll < 0.5:
                asked = {"gpus": 1, "mig_profile": rng.choice(PROFILES)}
                if rng.random() < 0.3:
                    asked["ttl_s"] = 0.2
                response = client.post("/v1/place", json=asked)
                if response.status_code == 201:
                    with lock:
                        held.append(str(response.json()["id"]))
            elif roll < 0.75:
                with lock:
                    victim = held.pop(rng.randrange(len(held))) if held else None
                if victim is None:
                    return
                response = client.post(f"/v1/allocations/{victim}/release")
            else:
                with lock:
                    job = next(jobs)
                first = rng.randrange(len(snap.gpus))
                gres = f"gpu:1(IDX:{first})"
                text = show_job(job, gres, nodes=NODE)
                response = client.post(
                    "/v1/slurm/job-started", json={"show_job": text, "job_name": "train"}
                )
                if rng.random() < 0.5:
                    client.post(f"/v1/jobs/{job}/release")
            answers.append((str(response.request.url), response.status_code, response.text))

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            for _ in range(STEPS):
                step(rng)

        try:
            with ThreadPoolExecutor(THREADS) as pool:
                for done in [pool.submit(worker, seed) for seed in range(THREADS)]:
                    done.result()
            time.sleep(0.5)  # the short TTLs pass and the sweeps run
            engine = sa.create_engine(postgres_url)
            try:
                _, states = database_view(engine)  # asserts the pools and the holds
            finally:
                engine.dispose()
        finally:
            for client in clients:
                client.close()
    failed = [a for a in answers if a[1] >= 500]
    assert not failed, failed[:3]
    assert any(s == "released" for s in states.values())
    assert sum(code == 201 for _, code, _ in answers) > 10, answers[:5]
