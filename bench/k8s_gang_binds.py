"""Gangs through filter + prioritize + bind over HTTP, binds in flight while members are filtered.

kube-scheduler schedules pods one at a time but binds them concurrently: it
filters the next gang member while the earlier members' binds are still
running, and leaves out of that member's candidates the nodes it assumed for
them. This drives ``topoplace serve`` the same way, over HTTP: 20 gangs of
3 to 16 members, each member asking for the 4 GPUs of one GB200 NVL72 tray
(``gb200-tray`` profile, 18 trays a rack), members filtered in turn over
every tray not yet assumed, prioritized when more than one passes, each bind
sent on its own thread without waiting for the one before. The bind writes
the Binding to a stand-in API server on loopback that takes
``--api-delay-ms`` to answer (an etcd write), so binds overlap.

Counted: binds refused (target 0; a refused member is filtered again, as the
scheduler retries it, and its time counts), and each gang's time from its
first member's filter to its last member's bind answered (target 0.5 s).
After each gang its reservation is released, so every run finds the same
fleet.

Run: ``python -m bench.k8s_gang_binds [--quick] [--postgres URL]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from bench.k8s_objects import binding_args, names_args, pod
from bench.k8s_pods_per_second import _fresh_postgres, _kubeconfig, _Quiet, _thread_server
from bench.machine import describe
from bench.service_speed import seed, serve
from placement import ClusterState
from placement.profiles import build_profile

TARGET_GANG_S = 0.5
RACKS = 3
TRAYS_PER_RACK = 18
GPUS_PER_MEMBER = 4  # one whole tray
SIZES = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 3, 4, 8, 12, 16, 16]


def _api_server(delay_s: float) -> type[_Quiet]:
    class Api(_Quiet):
        """Answers a Binding with 201 after ``delay_s``; a pod list (a gang's first
        sight) with no pods."""

        def do_POST(self) -> None:
            self._body()
            time.sleep(delay_s)
            self._answer(201, b'{"kind":"Status","apiVersion":"v1","status":"Success","code":201}')

        def do_GET(self) -> None:
            self._answer(200, b'{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[]}')

    return Api


def _fleet() -> tuple[ClusterState, list[str]]:
    state = ClusterState()
    names: list[str] = []
    for rack in range(RACKS):
        for tray in range(TRAYS_PER_RACK):
            name = f"gb200-r{rack}-tray{tray:02d}"
            state.upsert(build_profile("gb200-tray", name))
            names.append(name)
    return state, names


class GangRun:
    def __init__(self, client: httpx.Client, names: list[str]) -> None:
        self.client = client
        self.names = names
        self.refused: list[str] = []
        self.binds = ThreadPoolExecutor(max_workers=16)  # the scheduler's binding cycles
        # Binds share one pool of keep-alive connections, as the scheduler's Go client does.
        self.bind_client = httpx.Client(
            base_url=str(client.base_url), timeout=30, limits=httpx.Limits(max_connections=16)
        )

    def _schedule_one(self, member: dict[str, Any], assumed: set[str]) -> str:
        """The scheduling cycle: filter over the trays not assumed, prioritize, pick."""
        candidates = [n for n in self.names if n not in assumed]
        result = self.client.post("/k8s/v1/filter", json=names_args(member, candidates)).json()
        passing: list[str] = result["NodeNames"] or []
        if not passing:
            raise RuntimeError(f"no tray passed for {member['metadata']['name']}: {result}")
        if len(passing) == 1:  # kube-scheduler skips prioritize when one node is left
            return passing[0]
        scores = self.client.post("/k8s/v1/prioritize", json=names_args(member, passing)).json()
        best: str = max(scores, key=lambda s: s["Score"])["Host"]
        return best

    def _bind(self, member: dict[str, Any], node: str) -> str:
        reply = self.bind_client.post("/k8s/v1/bind", json=binding_args(member, node))
        error: str = reply.json()["Error"]
        return error

    def run(self, gang: str, size: int) -> float:
        """One gang, first filter to last bind answered, in seconds."""
        notes = {
            "topoplace.io/gang": gang,
            "topoplace.io/gang-size": str(size),
            "topoplace.io/locality": "nvlink",
        }
        members = [pod(f"{gang}-{i}", GPUS_PER_MEMBER, annotations=notes) for i in range(size)]
        queue = list(members)
        assumed: dict[str, str] = {}  # member name -> node, while its bind is in flight or done
        inflight: dict[str, Future[str]] = {}
        start = time.perf_counter()
        while queue or inflight:
            if queue:
                member = queue.pop(0)
                node = self._schedule_one(member, set(assumed.values()))
                assumed[member["metadata"]["name"]] = node
                inflight[member["metadata"]["name"]] = self.binds.submit(self._bind, member, node)
            for name, done in list(inflight.items()):
                if done.done() or not queue:
                    error = done.result()
                    del inflight[name]
                    if error:  # the scheduler forgets the assumption and retries the pod
                        self.refused.append(error)
                        del assumed[name]
                        queue.append(next(m for m in members if m["metadata"]["name"] == name))
        took = time.perf_counter() - start
        # The members are done: give the trays back for the next gang (as the pod watch
        # does when the last member ends).
        live = self.client.get("/v1/allocations", params={"job_id": f"k8s-gang:ml-team/{gang}"})
        for allocation in live.json()["allocations"]:
            self.client.post(f"/v1/allocations/{allocation['id']}/release").raise_for_status()
        return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the first 6 gangs only")
    parser.add_argument("--api-delay-ms", type=float, default=10.0, help="Binding answer delay")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="an empty Postgres database is made on this server (URL of any database on"
        " it); default a SQLite file",
    )
    args = parser.parse_args()
    sizes = SIZES[:6] if args.quick else SIZES
    print(describe())
    state, names = _fleet()
    with (
        _thread_server(_api_server(args.api_delay_ms / 1000)) as api_port,
        tempfile.TemporaryDirectory() as tmp,
    ):
        kubeconfig = Path(tmp) / "kubeconfig"
        _kubeconfig(kubeconfig, api_port)
        os.environ.update(
            TOPOPLACE_K8S_KUBECONFIG=str(kubeconfig),
            TOPOPLACE_K8S_WATCH="false",
            TOPOPLACE_K8S_WAKE_NODES="false",
            TOPOPLACE_K8S_RECONCILE_INTERVAL_S="0",
        )
        url = (
            _fresh_postgres(args.postgres, "k8s_gang_bench")
            if args.postgres
            else f"sqlite:///{Path(tmp) / 'serve.sqlite3'}"
        )
        seed(url, state)
        with serve(url) as (base, _pid), httpx.Client(base_url=base, timeout=30) as client:
            runner = GangRun(client, names)
            runner.run("warmup", 3)
            runner.refused.clear()
            times = [runner.run(f"g{i:02d}", size) for i, size in enumerate(sizes)]
            runner.binds.shutdown()
            runner.bind_client.close()
    print(f"{'gang':>5} {'members':>7} {'seconds':>8}")
    for i, (size, took) in enumerate(zip(sizes, times, strict=True)):
        print(f"{i:>5} {size:>7} {took:>8.3f}")
    worst = max(times)
    print(
        f"{len(sizes)} gangs of {min(sizes)}-{max(sizes)} members x {GPUS_PER_MEMBER} GPUs on"
        f" {len(names)} trays, Binding answered after {args.api_delay_ms:g} ms:"
        f" bind refusals {len(runner.refused)} (target 0); gang time p50"
        f" {statistics.median(times):.3f} s, max {worst:.3f} s (target {TARGET_GANG_S} s):"
        f" {'ok' if not runner.refused and worst <= TARGET_GANG_S else 'OVER'}"
    )
    for error in runner.refused[:5]:
        print("  refused:", error)


if __name__ == "__main__":
    main()
