"""A storm of refused placements: what their audit rows cost, with and without the gate.

In process, on a fresh Postgres database holding 1,000 simulated nodes (the
engine benchmark's fleet): one impossible request (48 GPUs on one node) sent
through the allocations API again and again, as one client would hammer
/place, timed each. Blocks alternate on the same state and database between
three gates (service/audit/refusals.py): ``none`` writes no refusal row (the
baseline), ``shipped`` the default (one row per shape a minute) and
``every`` a row per refusal (window 0), so all three see the same machine
and drift; the ratios are of one run.

Run: ``python -m bench.refusal_storm [--quick]`` (TOPOPLACE_BENCH_DATABASE_URL, else
the local Postgres).
"""

from __future__ import annotations

import argparse
import os
import time

import sqlalchemy as sa

from bench.engine_speed import build_cluster
from bench.machine import StealMeter, describe
from bench.service_speed import DEFAULT_URL, fresh_database, ms, seed
from service.allocations import api
from service.allocations.schemas import PlaceRequest
from service.audit.refusals import RefusalGate
from service.db import make_engine
from service.errors import Unresolvable
from service.schema import audit_log
from service.settings import Settings
from service.state import ServiceState

NODES = 1_000
GATES = {
    "none": lambda: RefusalGate(60.0, 0),
    "shipped": lambda: RefusalGate(60.0, 600),
    "every": lambda: RefusalGate(0.0, 10**9),
}


def one_block(state: ServiceState, count: int) -> list[float]:
    body = PlaceRequest(gpus=48, ttl_s=300)
    took = []
    for _ in range(count):
        started = time.perf_counter()
        try:
            api.place(state, body, None)
        except Unresolvable:
            pass
        else:
            raise AssertionError("the impossible request was placed")
        took.append(time.perf_counter() - started)
    return took


def rows(state: ServiceState) -> int:
    with state.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    blocks, per_block = (6, 100) if args.quick else (15, 200)
    print(f"machine: {describe()}")
    cluster = build_cluster(NODES, seed=NODES)
    with fresh_database(os.environ.get("TOPOPLACE_BENCH_DATABASE_URL", DEFAULT_URL)) as url:
        seed(url, cluster)
        settings = Settings(database_url=url, heartbeat_ttl_s=86_400, insecure_dev=True)
        engine = make_engine(url)
        state = ServiceState(settings, engine)
        try:
            state.load()
            one_block(state, 50)  # warm: connections, caches
            results: dict[str, list[float]] = {name: [] for name in GATES}
            written: dict[str, int] = dict.fromkeys(GATES, 0)
            steal = StealMeter()
            for block in range(blocks):
                name = list(GATES)[block % len(GATES)]
                state.refusal_gate = GATES[name]()
                before = rows(state)
                results[name].extend(one_block(state, per_block))
                written[name] += rows(state) - before
            stolen = steal.percent()
        finally:
            state.committer.stop()
            engine.dispose()
    print(f"\n{NODES:,} nodes, {blocks} alternating blocks of {per_block} refusals")
    print("\n| gate | refused p50 ms | p99 ms | audit rows written |")
    print("|---|---|---|---|")
    for name, took in results.items():
        print(f"| {name} | {ms(took, 50):.2f} | {ms(took, 99):.2f} | {written[name]} |")
    base = ms(results["none"], 50)
    print(
        f"\nrefused p50 shipped / none: {ms(results['shipped'], 50) / base:.3f};"
        f" every / none: {ms(results['every'], 50) / base:.3f}; CPU steal {stolen:.1f} %"
    )


if __name__ == "__main__":
    main()
