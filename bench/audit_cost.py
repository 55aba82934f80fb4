"""The audit log's cost on /place and release: the allocations API with and without its rows.

In process, on a fresh Postgres database holding 1,000 simulated nodes (the
engine benchmark's fleet): a place (1 GPU) through the allocations API as
gRPC and the Kubernetes bind call it (the thread driver: decide, then the
group commit's transaction) and then its release, one after another, timed
each. The same service state alternates between blocks with the audit rows
written (as shipped) and blocks with them switched off here, so both modes
see the same machine, database and drift; the shares are of one run.

What "off" removes: the placement's row in the group commit's batch (one
multi-row insert) and the release's row in its transaction (one read of the
ended allocations and one insert). REST /place adds HTTP and JSON on top of
both modes alike (bench/service_speed.py).

Run: ``python -m bench.audit_cost [--quick]`` (TOPOPLACE_BENCH_DATABASE_URL, else
the local Postgres).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from bench.engine_speed import build_cluster
from bench.machine import StealMeter, describe
from bench.service_speed import DEFAULT_URL, fresh_database, ms, seed
from service.allocations import api
from service.allocations.schemas import PlaceRequest
from service.audit import records, store
from service.db import make_engine
from service.schema import audit_log
from service.settings import Settings
from service.state import ServiceState

NODES = 1_000


@contextlib.contextmanager
def audit_off() -> Iterator[None]:
    """The allocations API as it would be without audit rows: none built, none written."""
    saved: dict[tuple[Any, str], Any] = {}
    for owner, name, stand_in in (
        (records, "placed", lambda *args, **kwargs: None),
        (store, "write", lambda conn, rows: None),
        (store, "write_allocations", lambda conn, action, ids, at: None),
    ):
        saved[(owner, name)] = getattr(owner, name)
        setattr(owner, name, stand_in)
    try:
        yield
    finally:
        for (owner, name), original in saved.items():
            setattr(owner, name, original)


def one_block(state: ServiceState, count: int) -> tuple[list[float], list[float]]:
    places, releases = [], []
    body = PlaceRequest(gpus=1, ttl_s=300)
    for _ in range(count):
        started = time.perf_counter()
        placed = api.place(state, body, None)
        middle = time.perf_counter()
        api.release(state, placed.allocation.id)
        places.append(middle - started)
        releases.append(time.perf_counter() - middle)
    return places, releases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    blocks, per_block = (6, 100) if args.quick else (20, 200)
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
            results: dict[str, tuple[list[float], list[float]]] = {"on": ([], []), "off": ([], [])}
            steal = StealMeter()
            for block in range(blocks):
                mode = "on" if block % 2 == 0 else "off"
                with audit_off() if mode == "off" else contextlib.nullcontext():
                    places, releases = one_block(state, per_block)
                results[mode][0].extend(places)
                results[mode][1].extend(releases)
            stolen = steal.percent()
            with engine.connect() as conn:
                rows = conn.execute(sa.select(sa.func.count()).select_from(audit_log)).scalar()
        finally:
            state.committer.stop()
            engine.dispose()
    print(f"\n{NODES:,} nodes, {blocks} alternating blocks of {per_block}; audit rows: {rows}")
    print("\n| audit rows | place p50 ms | place p99 ms | release p50 ms | release p99 ms |")
    print("|---|---|---|---|---|")
    for mode in ("off", "on"):
        places, releases = results[mode]
        print(
            f"| {mode} | {ms(places, 50):.2f} | {ms(places, 99):.2f}"
            f" | {ms(releases, 50):.2f} | {ms(releases, 99):.2f} |"
        )
    on, off = results["on"], results["off"]
    print(
        f"\nplace p50 with / without: {ms(on[0], 50) / ms(off[0], 50):.3f};"
        f" release p50: {ms(on[1], 50) / ms(off[1], 50):.3f}; CPU steal {stolen:.1f} %"
    )


if __name__ == "__main__":
    main()
