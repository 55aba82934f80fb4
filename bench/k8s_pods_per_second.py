"""Pods per second through filter + prioritize + bind over HTTP, as kube-scheduler drives them.

kube-scheduler with topoplace as its extender makes three HTTP exchanges per
GPU pod (filter, prioritize, bind; ``nodeCacheCapable: true``), and the
bind writes the pod's Binding to the API server. This measures that
sequence, pod after pod on one keep-alive connection as the scheduler's Go
client holds it, against:

- ``topoplace serve`` (SQLite, the fleet seeded, the pod watch, wake-up and
  reconciler off) whose bind reserves the GPUs, then POSTs the Binding to a
  stand-in API server on loopback that answers 201;
- in the same run, a do-nothing extender on loopback: filter passes every
  node, prioritize scores 0, bind POSTs the same Binding to the same API
  server. The difference is what topoplace's work costs a pod on top of the
  protocol itself (target: at most 2 ms).

Run: ``python -m bench.k8s_pods_per_second [--quick]``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from bench.k8s_objects import binding_args, names_args, pod
from bench.machine import describe
from bench.service_speed import seed, serve
from placement import ClusterState
from placement.profiles import build_profile

TARGET_ADDED_MS = 2.0
WARM_UP = 5
BLOCK = 10  # pods per extender before the other takes its turn
TOKEN = "bench-token"


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # else a small reply waits on the peer's delayed ACK

    def log_message(self, format: str, *args: Any) -> None:
        return

    def _answer(self, status: int, body: bytes) -> None:
        head = (
            f"HTTP/1.1 {status} {self.responses[status][0]}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        self.wfile.write(head.encode() + body)  # one write: headers and body in one segment

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))


class _ApiServer(_Quiet):
    """Answers every Binding with 201, as the API server does for a pending pod."""

    bindings = 0

    def do_POST(self) -> None:
        self._body()
        type(self).bindings += 1
        self._answer(201, b'{"kind":"Status","apiVersion":"v1","status":"Success","code":201}')


def _binding(args: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args["PodName"], "namespace": args["PodNamespace"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
        }
    ).encode()


def _nothing_extender(api_port: int) -> type[_Quiet]:
    local = threading.local()

    class Nothing(_Quiet):
        """The protocol and nothing else: every node passes, no scores, the Binding made."""

        def do_POST(self) -> None:
            args = json.loads(self._body())
            if self.path.endswith("/filter"):
                names = args["NodeNames"]
                reply: Any = {"Nodes": None, "NodeNames": names, "FailedNodes": {}, "Error": ""}
            elif self.path.endswith("/prioritize"):
                reply = [{"Host": n, "Score": 0} for n in args["NodeNames"]]
            else:
                conn = getattr(local, "conn", None)
                if conn is None:
                    conn = local.conn = http.client.HTTPConnection("127.0.0.1", api_port)
                path = f"/api/v1/namespaces/{args['PodNamespace']}/pods/{args['PodName']}/binding"
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
                conn.request("POST", path, _binding(args), headers)
                conn.getresponse().read()
                reply = {"Error": ""}
            self._answer(200, json.dumps(reply).encode())

    return Nothing


@contextmanager
def _thread_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def _fleet(nodes: int) -> ClusterState:
    state = ClusterState()
    for i in range(nodes):
        state.upsert(build_profile("hgx-h100", f"h100-{i:04d}"))
    return state


def schedule(
    base: str, names: list[str], pods: int, first: int, verbs: dict[str, list[float]]
) -> list[float]:
    """Seconds per pod (pods ``first`` on): filter, prioritize with the nodes that passed,
    bind to the best; each verb's own times land in ``verbs`` (where the time goes)."""
    times: list[float] = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for i in range(first, first + pods):
            p = pod(f"bench-{i:05d}", 1)
            start = time.perf_counter()
            filtered = client.post("/k8s/v1/filter", json=names_args(p, names)).json()
            t1 = time.perf_counter()
            passing = filtered["NodeNames"]
            if len(passing) > 1:  # kube-scheduler skips prioritize when one node is left
                scores = client.post("/k8s/v1/prioritize", json=names_args(p, passing)).json()
                best = max(scores, key=lambda s: s["Score"])["Host"]
            else:
                best = passing[0]
            t2 = time.perf_counter()
            bound = client.post("/k8s/v1/bind", json=binding_args(p, best)).json()
            end = time.perf_counter()
            times.append(end - start)
            for verb, took in (("filter", t1 - start), ("prioritize", t2 - t1), ("bind", end - t2)):
                verbs.setdefault(verb, []).append(took)
            if bound["Error"]:
                raise RuntimeError(bound["Error"])
    return times


def _kubeconfig(path: Path, api_port: int) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{api_port}'}}}}]\n"
        f"users: [{{name: u, user: {{token: {TOKEN}}}}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )


def _fresh_postgres(server_url: str, name: str) -> str:
    admin = sa.create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return sa.make_url(server_url).set(database=name).render_as_string(hide_password=False)


def _summary(times: list[float], verb_times: dict[str, list[float]]) -> dict[str, float]:
    ordered = sorted(times)
    verbs = {f"{v}_p50_ms": statistics.median(t) * 1000 for v, t in verb_times.items()}
    return {
        **verbs,
        "pods_per_s": len(times) / sum(times),
        "p50_ms": statistics.median(ordered) * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "mean_ms": statistics.fmean(times) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer pods")
    parser.add_argument(
        "--postgres",
        metavar="URL",
        help="an empty Postgres database per fleet size is made on this server (URL of"
        " any database on it); default SQLite files",
    )
    args = parser.parse_args()
    pods = 60 if args.quick else 300
    print(describe())
    results: dict[int, dict[str, dict[str, float]]] = {}
    with _thread_server(_ApiServer) as api_port, tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        _kubeconfig(kubeconfig, api_port)
        os.environ.update(
            TOPOPLACE_K8S_KUBECONFIG=str(kubeconfig),
            TOPOPLACE_K8S_WATCH="false",
            TOPOPLACE_K8S_WAKE_NODES="false",
            TOPOPLACE_K8S_RECONCILE_INTERVAL_S="0",
        )
        for size in (12, 500):
            names = [f"h100-{i:04d}" for i in range(size)]
            # One GPU a pod, the warm-up's included: the fleet never fills.
            count = min(pods, size * 8 - 16 - WARM_UP)
            url = (
                _fresh_postgres(args.postgres, f"k8s_pods_bench_{size}")
                if args.postgres
                else f"sqlite:///{Path(tmp) / f'serve-{size}.sqlite3'}"
            )
            seed(url, _fleet(size))
            with _thread_server(_nothing_extender(api_port)) as port, serve(url) as (base, _pid):
                bases = {"do-nothing": f"http://127.0.0.1:{port}", "topoplace": base}
                times: dict[str, list[float]] = {name: [] for name in bases}
                verbs: dict[str, dict[str, list[float]]] = {name: {} for name in bases}
                for at in bases.values():
                    schedule(at, names, WARM_UP, 0, {})
                # Alternate short blocks: this machine's speed drifts within a run by as
                # much as the difference measured, and both extenders should see the same.
                for first in range(WARM_UP, WARM_UP + count, BLOCK):
                    block = min(BLOCK, WARM_UP + count - first)
                    for name, at in bases.items():
                        times[name] += schedule(at, names, block, first, verbs[name])
            results[size] = {name: _summary(times[name], verbs[name]) for name in bases}
    print(f"{'nodes':>5} {'extender':<11} {'pods/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for size, rows in results.items():
        for name, row in rows.items():
            print(
                f"{size:>5} {name:<11} {row['pods_per_s']:>8.0f} {row['p50_ms']:>8.2f}"
                f" {row['p99_ms']:>8.2f} {row['mean_ms']:>8.2f}   p50 filter"
                f" {row['filter_p50_ms']:.2f}, prioritize {row['prioritize_p50_ms']:.2f},"
                f" bind {row['bind_p50_ms']:.2f} ms"
            )
        added = rows["topoplace"]["p50_ms"] - rows["do-nothing"]["p50_ms"]
        added_mean = rows["topoplace"]["mean_ms"] - rows["do-nothing"]["mean_ms"]
        ratio = rows["do-nothing"]["pods_per_s"] / rows["topoplace"]["pods_per_s"]
        verdict = "ok" if added <= TARGET_ADDED_MS else "OVER"
        print(
            f"{size:>5} topoplace adds {added:.2f} ms a pod at p50 ({added_mean:.2f} ms mean;"
            f" {ratio:.2f}x the do-nothing time; target {TARGET_ADDED_MS} ms): {verdict}"
        )


if __name__ == "__main__":
    main()
