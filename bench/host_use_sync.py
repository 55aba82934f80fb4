"""What a sync pays to count the host use (``cpu_milli``, ``memory_mib``) of live allocations.

Every sync reads it (service.state.host_use): the whole fleet's at a resync,
the nodes named at a release or a notification. Before migration 0017 the
figures were read out of each live row's stored request: a LIKE over the JSON
text, then the matches parsed. Since, they are columns of their own. Both
queries run here on the same database: ``--live`` live allocations (one GPU
each, spread over ``--nodes`` nodes), ``--share`` of them with figures, the
rest without (``"cpu_milli":null``, as every request that leaves them out is
stored); the median of ``--repeat`` runs of each, full and for one node.

Run: ``python -m bench.host_use_sync [--live 5000] [--share 0.1]``; SQLite in a
temporary file, and Postgres when TOPOPLACE_BENCH_DATABASE_URL names a database
(emptied first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

import sqlalchemy as sa

from service import migrate, schema
from service.allocations.schemas import PlaceRequest
from service.state import host_use


def like_and_parse(conn: sa.Connection, names: list[str] | None) -> dict[str, tuple[int, int]]:
    """The query before migration 0017, kept to measure against."""
    rows, holds, shared = schema.allocations, schema.gpu_holds, schema.gpu_shares
    carries = sa.or_(
        *(
            sa.and_(rows.c.request.contains(f'"{f}":'), ~rows.c.request.contains(f'"{f}":null'))
            for f in ("cpu_milli", "memory_mib")
        )
    )
    query = sa.select(rows.c.request, rows.c.placement).where(rows.c.live.is_(True), carries)
    if names is not None:
        on_nodes = sa.union(
            sa.select(holds.c.allocation_id).where(holds.c.node.in_(names)),
            sa.select(shared.c.allocation_id).where(shared.c.node.in_(names)),
        )
        query = query.where(rows.c.id.in_(on_nodes))
    use: dict[str, tuple[int, int]] = {}
    for request, placement in conn.execute(query):
        asked = json.loads(request)
        cpu, memory = int(asked.get("cpu_milli") or 0), int(asked.get("memory_mib") or 0)
        for task in json.loads(placement).get("tasks", ()):
            node = str(task["node"])
            c, m = use.get(node, (0, 0))
            use[node] = (c + cpu, m + memory)
    return use


def seed(engine: sa.Engine, live: int, nodes: int, share: float) -> None:
    with engine.begin() as conn:
        for table in reversed(schema.metadata.sorted_tables):
            conn.execute(table.delete())
    now = datetime(2026, 12, 6, tzinfo=UTC)
    every = round(1 / share) if share > 0 else 0
    rows, holds = [], []
    for i in range(live):
        node, device = f"n{i % nodes:04d}", f"GPU-{i:08d}"
        figured = every > 0 and i % every == 0
        cpu, memory = (500, 1024) if figured else (None, None)
        request = PlaceRequest(gpus=1, job_id=f"job-{i}", cpu_milli=cpu, memory_mib=memory)
        placement = {"tasks": [{"task": 0, "node": node, "gpu_uuids": [device]}]}
        rows.append(
            {
                "id": f"a{i:08d}",
                "state": "active",
                "job_id": request.job_id,
                "request": request.model_dump_json(),
                "placement": json.dumps(placement),
                "created_at": now,
                "live": True,
                "anchor_node": node,
                "anchor_device": device,
                "cpu_milli": cpu,
                "memory_mib": memory,
            }
        )
        holds.append({"node": node, "device": device, "kind": "gpu", "allocation_id": f"a{i:08d}"})
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.allocations), rows)
        conn.execute(sa.insert(schema.gpu_holds), holds)


def timed(
    engine: sa.Engine, count: Callable[..., object], names: list[str] | None, n: int
) -> float:
    """Median seconds of ``n`` reads, each on a connection of its own (as a sync)."""
    times = []
    for _ in range(n):
        with engine.connect() as conn:
            start = time.perf_counter()
            count(conn, names)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(url: str, live: int, nodes: int, share: float, repeat: int) -> None:
    migrate.upgrade(url)
    engine = sa.create_engine(url)
    try:
        seed(engine, live, nodes, share)
        with engine.connect() as conn:
            assert host_use(conn, None) == like_and_parse(conn, None)
        one = ["n0000"]
        for label, names in (("full sync", None), ("one node", one)):
            before = timed(engine, like_and_parse, names, repeat)
            after = timed(engine, host_use, names, repeat)
            print(
                f"{engine.dialect.name:10} {label:9}: LIKE+parse {before * 1e3:8.2f} ms,"
                f" columns {after * 1e3:8.2f} ms ({before / after:5.1f}x)"
            )
    finally:
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument("--repeat", type=int, default=21)
    args = parser.parse_args()
    print(f"{args.live} live allocations on {args.nodes} nodes, {args.share:.0%} with figures")
    with tempfile.TemporaryDirectory() as tmp:
        run(f"sqlite:///{tmp}/bench.sqlite3", args.live, args.nodes, args.share, args.repeat)
    if url := os.environ.get("TOPOPLACE_BENCH_DATABASE_URL"):
        run(url, args.live, args.nodes, args.share, args.repeat)


if __name__ == "__main__":
    main()
