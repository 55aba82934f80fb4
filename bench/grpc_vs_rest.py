"""Place over gRPC against /v1/place over REST: same process, same cluster, same load.

One `topoplace serve` process serving both transports on a fresh Postgres
database holding the engine benchmark's mixed fleet of 1,000 nodes (the
service benchmark's setup, bench/service_speed.py, whose helpers run the
server and the load). For each transport, in turn:

1. a fixed offered load below saturation (open loop: latency counts from
   the moment a request was due, so queueing shows);
2. saturation: 32 callers back to back.

Between phases every allocation of the phase is released, so each phase
starts from the same empty cluster. Each phase runs twice, in the order
REST, gRPC, gRPC, REST, so that warm-up and drift do not favour one side.
The clients are threads of this process, on the same cores as the server
and Postgres: the REST client is httpx, the gRPC client grpcio's C core, as
real schedulers would use. Printed: per-transport latencies and throughput,
and the ratios gRPC / REST.

Needs a Postgres server: TOPOPLACE_BENCH_DATABASE_URL, else the local one.
Run: ``python -m bench.grpc_vs_rest [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import random
from collections.abc import Callable

import grpc
import httpx

from bench.engine_speed import build_cluster
from bench.machine import describe
from bench.service_speed import (
    DEFAULT_URL,
    _request,
    closed_loop,
    free_port,
    fresh_database,
    ms,
    open_loop,
    rest_sender,
    seed,
    serve,
)
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc

NODES = 1_000
OFFERED = 60.0  # requests/s: below one process's saturation, so latency is service time
CLIENTS = 32


def grpc_sender(stub: pb_grpc.TopoplaceStub) -> Callable[[dict[str, object]], bool]:
    def send(body: dict[str, object]) -> bool:
        try:
            request = pb.PlaceRequest(gpus=int(str(body["gpus"])), job_id=str(body["job_id"]))
            stub.Place(request, timeout=30)
        except grpc.RpcError:
            return False
        return True

    return send


def phase_body(job: str) -> Callable[[random.Random], dict[str, object]]:
    """The service benchmark's request mix, all under one job id so a phase is released at once."""
    return lambda rng: {**_request(rng), "job_id": job}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    seconds = 3.0 if args.quick else 10.0
    base_url = os.environ.get("TOPOPLACE_BENCH_DATABASE_URL", DEFAULT_URL)
    print(f"machine: {describe()}")
    grpc_port = free_port()
    results: dict[str, dict[str, list[float]]] = {
        t: {"lat": [], "rate": [], "errors": []} for t in ("REST", "gRPC")
    }
    with fresh_database(base_url) as url:
        seed(url, build_cluster(NODES, seed=NODES))
        with (
            serve(url, grpc_port=grpc_port) as (base, _pid),
            httpx.Client(
                base_url=base, timeout=30, limits=httpx.Limits(max_connections=64)
            ) as http,
            grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel,
        ):
            grpc.channel_ready_future(channel).result(timeout=30)
            senders = {
                "REST": rest_sender(http),
                "gRPC": grpc_sender(pb_grpc.TopoplaceStub(channel)),
            }
            for round_, transport in enumerate(("REST", "gRPC", "gRPC", "REST")):
                send = senders[transport]
                job = f"bench-{transport}-{round_}"
                closed_loop(send, 1.0, 4, phase_body(job))  # warm-up: connections, caches
                lat, errors = open_loop(send, OFFERED, seconds, phase_body(job))
                http.post(f"/v1/jobs/{job}/release").raise_for_status()
                rate, sat_errors = closed_loop(send, seconds, CLIENTS, phase_body(job))
                http.post(f"/v1/jobs/{job}/release").raise_for_status()
                results[transport]["lat"] += lat
                results[transport]["rate"].append(rate)
                results[transport]["errors"].append(errors + sat_errors)
    print(f"\n{NODES:,} nodes, Postgres, one process serving both; each phase {seconds:g} s, twice")
    print(
        f"\n| transport | offered req/s | p50 ms | p99 ms | saturation req/s ({CLIENTS} callers)"
        " | failed calls |"
    )
    print("|---|---|---|---|---|---|")
    for transport, r in results.items():
        rate = sum(r["rate"]) / len(r["rate"])
        print(
            f"| {transport} | {OFFERED:g} | {ms(r['lat'], 50):.1f} | {ms(r['lat'], 99):.1f} "
            f"| {rate:,.0f} | {int(sum(r['errors']))} |"
        )
    rest, grpc_ = results["REST"], results["gRPC"]
    throughput = (sum(grpc_["rate"]) / len(grpc_["rate"])) / (sum(rest["rate"]) / len(rest["rate"]))
    print(f"\ngRPC / REST saturation throughput: {throughput:.2f}x")
    for q in (50, 99):
        ratio = ms(grpc_["lat"], q) / ms(rest["lat"], q)
        print(f"gRPC / REST p{q} latency at {OFFERED:g} req/s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
