"""How soon a pod's GPUs are free after the pod is deleted or finishes (the pod watch).

``topoplace serve`` (SQLite, a fleet of H100 nodes seeded) follows pods on a
stand-in API server on loopback with a real list-and-watch (chunked JSON
events, resourceVersions: tests/service/k8s/fake_api_server.py), the
reconciler off, so every release comes from the watch. Pods are bound
through the extender's bind (their reservation written, the Binding
posted), then ended: deleted, or their phase set to Succeeded or Failed.
Latency is from the API server's event (the change, timed just before it is
made) to the allocation no longer live on the service's REST API (the live
allocations listed in one request every millisecond; each one gone then
read to be sure it was released). Two patterns: pods ended one at a time
while others keep running, and bursts of pods ended at once. Target (the
Kubernetes issue: watch, not poll): p99 at most 1 s.

Run: ``python -m bench.k8s_release [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.k8s_objects import binding_args, pod
from bench.k8s_pods_per_second import _fleet, _kubeconfig
from bench.machine import describe
from bench.service_speed import seed, serve
from tests.service.k8s.fake_api_server import FakeApiServer

TARGET_P99_S = 1.0
NODES = 12
TOKEN = "bench-token"
ENDINGS = ("delete", "Succeeded", "Failed")
ALLOCATION = "topoplace.io/allocation"


def _bind(http: httpx.Client, api: FakeApiServer, name: str, i: int) -> tuple[dict[str, Any], str]:
    """A one-GPU pod added to the API server and bound by the extender to the ``i``-th
    node in turn: (pod, its allocation's id, as the Binding's annotation carries it)."""
    p = api.add(pod(name, 1))
    node = f"h100-{i % NODES:04d}"
    answer = http.post("/k8s/v1/bind", json=binding_args(p, node)).json()
    if answer["Error"]:
        raise RuntimeError(answer["Error"])
    notes = api.pod("ml-team", name)["metadata"]["annotations"]
    return p, str(notes[ALLOCATION])


def _end(api: FakeApiServer, name: str, how: str) -> float:
    started = time.perf_counter()
    if how == "delete":
        api.delete("ml-team", name)
    else:
        api.set_phase("ml-team", name, "Running")
        started = time.perf_counter()  # from the change that ends it
        api.set_phase("ml-team", name, how)
    return started


def _released_after(http: httpx.Client, allocations: dict[str, float]) -> dict[str, float]:
    """Seconds from each end to its allocation no longer live: the active ones listed in
    one request every millisecond (one poll for a whole burst), each gone one then read
    to be sure it was released (not expired)."""
    waiting = dict(allocations)
    out: dict[str, float] = {}
    deadline = time.perf_counter() + 30
    while waiting and time.perf_counter() < deadline:
        listed = http.get("/v1/allocations", params={"state": "active", "limit": 10_000})
        now = time.perf_counter()
        live = {a["id"] for a in listed.json()["allocations"]}
        for allocation_id in [a for a in waiting if a not in live]:
            out[allocation_id] = now - waiting.pop(allocation_id)
        time.sleep(0.001)
    if waiting:
        raise TimeoutError(f"{len(waiting)} allocations still held after 30 s")
    for allocation_id in out:
        state = http.get(f"/v1/allocations/{allocation_id}").json()["state"]
        if state != "released":
            raise RuntimeError(f"allocation {allocation_id} ended {state}, not released")
    return out


def one_at_a_time(http: httpx.Client, api: FakeApiServer, pods: int, running: int) -> list[float]:
    """``running`` pods kept running; each new one bound, then the oldest ended."""
    alive: list[tuple[str, str]] = []
    took: list[float] = []
    for i in range(pods + running):
        name = f"steady-{i:05d}"
        _, allocation_id = _bind(http, api, name, i)
        alive.append((name, allocation_id))
        if len(alive) > running:
            old, old_id = alive.pop(0)
            started = _end(api, old, ENDINGS[i % len(ENDINGS)])
            took += _released_after(http, {old_id: started}).values()
    for name, allocation_id in alive:
        _released_after(http, {allocation_id: _end(api, name, "delete")})
    return took


def bursts(http: httpx.Client, api: FakeApiServer, rounds: int, size: int) -> list[float]:
    """``size`` pods bound, then all ended at once (a Job's pods finishing together)."""
    took: list[float] = []
    for r in range(rounds):
        bound = [_bind(http, api, f"burst-{r:03d}-{i:03d}", i) for i in range(size)]
        started = {
            allocation_id: _end(api, p["metadata"]["name"], ENDINGS[i % len(ENDINGS)])
            for i, (p, allocation_id) in enumerate(bound)
        }
        took += _released_after(http, started).values()
    return took


def _row(label: str, took: list[float]) -> str:
    ordered = sorted(took)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    verdict = "ok" if p99 <= TARGET_P99_S else "OVER"
    return (
        f"{label:<34} {len(took):>5} {statistics.median(took) * 1000:>8.1f}"
        f" {p99 * 1000:>8.1f} {ordered[-1] * 1000:>8.1f}   {verdict}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer pods")
    args = parser.parse_args()
    pods, rounds = (60, 3) if args.quick else (300, 10)
    print(describe())
    api = FakeApiServer(TOKEN).start()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            _kubeconfig(kubeconfig, int(api.url.rsplit(":", 1)[1]))
            os.environ.update(
                TOPOPLACE_K8S_KUBECONFIG=str(kubeconfig),
                TOPOPLACE_K8S_WATCH="true",
                TOPOPLACE_K8S_WAKE_NODES="false",
                TOPOPLACE_K8S_RECONCILE_INTERVAL_S="0",  # every release is the watch's
            )
            url = f"sqlite:///{Path(tmp) / 'release.sqlite3'}"
            seed(url, _fleet(NODES))
            with serve(url) as (base, _pid), httpx.Client(base_url=base, timeout=30) as http:
                deadline = time.perf_counter() + 30
                while http.get("/readyz").json().get("kubernetes", {}).get("watch") != (
                    "following"
                ):
                    if time.perf_counter() > deadline:
                        raise TimeoutError("the pod watch never followed")
                    time.sleep(0.05)
                steady = one_at_a_time(http, api, pods, running=40)
                burst = bursts(http, api, rounds, size=32)
    finally:
        api.stop()
    print(f"{'pattern':<34} {'pods':>5} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    print(_row("one ended at a time, 40 running", steady))
    print(_row("32 ended at once", burst))
    print(f"target: p99 at most {TARGET_P99_S * 1000:.0f} ms from the pod's end to its release")


if __name__ == "__main__":
    main()
