"""Kubernetes extender speed: filter + prioritize for one pod over 500 and 10,000 candidates.

kube-scheduler calls filter then prioritize for every GPU pod, one pod at a
time, so their sum caps its throughput. Measured for a 4-GPU pod on the
engine benchmark's mixed fleet with half of every node's GPUs held at random:

1. server side: the extender's own handlers (bytes in, bytes out: parsing
   ExtenderArgs, judging, building the reply) timed inside the process,
   in the names mode (``nodeCacheCapable: true``) and the full-Node mode;
2. end to end: the same calls over HTTP on loopback to a `topoplace serve`
   process (SQLite) that loaded the same fleet with nothing held;
3. baselines in the same run: ``ClusterState.evaluate`` over the same
   candidates (a full TaskPlacement per node, what /v1/score does) and
   /v1/score over HTTP.

Run: ``python -m bench.k8s_extender [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson

from bench.engine_speed import build_cluster, fill
from bench.k8s_objects import names_args, nodes_args, pod
from bench.machine import describe
from bench.service_speed import evaluate_time, ms, seed, serve
from placement import ClusterState
from service.db import make_engine
from service.k8s.extender import Extender
from service.k8s.settings import ExtenderSettings
from service.settings import Settings
from service.state import ServiceState

TARGETS_MS = {500: 2.0, 10_000: 10.0}  # p99 of filter + prioritize, names mode


def extender_for(cluster: ClusterState, db: Path) -> Extender:
    settings = Settings(database_url=f"sqlite:///{db}", heartbeat_ttl_s=86_400)
    state = ServiceState(settings, make_engine(settings.database_url))
    state.cluster = cluster
    now = datetime.now(UTC)
    state.heartbeats = dict.fromkeys(cluster.names(), now)
    state.loaded = True
    # As the service's start-up does once the state is loaded.
    gc.collect()
    gc.freeze()
    return Extender(state, ExtenderSettings(reconcile_interval_s=0))


def _with_uid(template: bytes, i: int) -> bytes:
    # The pod's metadata.uid is the first "uid" in the body: a new pod every sample.
    uid = f"00000000-0000-4000-8000-{i:012d}"
    return template.replace(b'"uid":"', f'"uid":"{uid}'.encode(), 1)


def bodies(
    extender: Extender, names: list[str], full: bool, samples: int
) -> list[tuple[bytes, bytes]]:
    """(filter, prioritize) bodies, one pair per sample, as kube-scheduler sends them:
    prioritize gets the nodes filter let through."""
    build = nodes_args if full else names_args
    p = pod("trainer", 4)
    filter_template = orjson.dumps(build(p, names))
    first = orjson.loads(extender.filter(filter_template))
    passed = (
        first["NodeNames"] if not full else [n["metadata"]["name"] for n in first["Nodes"]["items"]]
    )
    assert passed, "the bench pod should fit somewhere"
    prioritize_template = orjson.dumps(build(p, passed))
    return [
        (_with_uid(filter_template, i), _with_uid(prioritize_template, i)) for i in range(samples)
    ]


def server_side(
    extender: Extender, names: list[str], full: bool, samples: int
) -> tuple[list[float], list[float]]:
    """(wall, CPU) seconds per filter + prioritize. The CPU time of this thread leaves out
    the time other processes on this shared machine took the core away."""
    wall, cpu = [], []
    for filter_args, prioritize_args in bodies(extender, names, full, samples):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        extender.filter(filter_args)
        extender.prioritize(prioritize_args)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return wall, cpu


def over_http(
    base: str, extender: Extender, names: list[str], full: bool, samples: int
) -> tuple[list[float], list[float]]:
    """(filter + prioritize, /v1/score baseline) round trips; the in-process extender only
    prepares the bodies (it judges the same fleet the served process loaded)."""
    client = httpx.Client(base_url=base, timeout=30)
    headers = {"content-type": "application/json"}
    pairs, score = [], []
    for filter_args, prioritize_args in bodies(extender, names, full, samples):
        t0 = time.perf_counter()
        r1 = client.post("/k8s/v1/filter", content=filter_args, headers=headers)
        r2 = client.post("/k8s/v1/prioritize", content=prioritize_args, headers=headers)
        pairs.append(time.perf_counter() - t0)
        assert r1.status_code == 200 and r2.status_code == 200
    if not full:
        for _ in range(min(samples, 50)):
            t0 = time.perf_counter()
            # Answers list at most 1,000 nodes (TOPOPLACE_MAX_SCORE_NODES): the first page.
            r = client.post("/v1/score?limit=1000", json={"gpus": 4, "nodes": names})
            assert r.status_code == 200, r.text[:500]
            score.append(time.perf_counter() - t0)
    client.close()
    return pairs, score


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(f"machine: {describe()}")
    # Full Node objects for 10,000 candidates are about 18 MB: over the default body limit.
    os.environ["TOPOPLACE_MAX_BODY_BYTES"] = str(64 * 1024 * 1024)
    samples = 100 if args.quick else 400
    rows, http_rows = [], []
    for size in (500, 10_000):
        cluster = build_cluster(size, seed=size)
        fill(cluster, 0.5, seed=size)
        names = sorted(cluster.names())
        with tempfile.TemporaryDirectory() as tmp:
            extender = extender_for(cluster, Path(tmp) / "bench.sqlite3")
            measured = []
            for full in (False, True):
                n = samples if not full or size <= 500 else max(20, samples // 10)
                measured.append((full, server_side(extender, names, full, n)))
            # After the extender: evaluate() fills caches the extender never needs.
            base = evaluate_time(cluster, names, max(20, samples // 10))
            for full, (lat, cpu) in measured:
                mode = "Node objects" if full else "names"
                target = f"{TARGETS_MS[size]:g}" if not full else "-"
                rows.append(
                    f"| {size:,} | {mode} | {ms(lat, 50):.2f} | {ms(lat, 99):.2f}"
                    f" | {ms(cpu, 99):.2f} | {target} "
                    f"| {ms(base, 50):.2f} | {ms(base, 50) / ms(lat, 50):.1f}x |"
                )
            db = Path(tmp) / "serve.sqlite3"
            url = f"sqlite:///{db}"
            empty = build_cluster(size, seed=size)
            seed(url, empty)
            # The served process starts with nothing held: its twin here prepares the bodies.
            twin = extender_for(empty, Path(tmp) / "twin.sqlite3")
            with serve(url) as (base_url, _pid):
                for full in (False, True):
                    n = samples if not full or size <= 500 else max(20, samples // 10)
                    lat, score = over_http(base_url, twin, names, full, n)
                    mode = "Node objects" if full else "names"
                    score_text = f"{ms(score, 50):.2f}" if score else "-"
                    http_rows.append(
                        f"| {size:,} | {mode} | {ms(lat, 50):.2f} | {ms(lat, 99):.2f}"
                        f" | {score_text} |"
                    )
    print("\nServer side (inside the process), filter + prioritize, ms:")
    print(
        "| candidates | mode | p50 | p99 | p99 CPU | p99 target | evaluate() p50 (baseline)"
        " | baseline / extender |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\nEnd to end over HTTP on loopback, filter + prioritize (two requests), ms:")
    print("| candidates | mode | p50 | p99 | /v1/score p50 (baseline, one request) |")
    print("|---|---|---|---|---|")
    print("\n".join(http_rows))


if __name__ == "__main__":
    main()
