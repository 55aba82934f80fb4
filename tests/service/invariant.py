"""The one promise, read back: what the database holds, checked, and what a replica shows."""

from __future__ import annotations

import json
from typing import Any

import httpx
import sqlalchemy as sa

from service import schema

LIVE = set(schema.LIVE_STATES)


def database_view(engine: sa.Engine) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """(held (node, GPU or MIG uuid), state by allocation id), after checking the
    database's own promise: holds only for live allocations, exactly their devices."""
    rows, holds = _consistent_read(engine)
    by_allocation: dict[str, set[tuple[str, str]]] = {}
    for node, device, allocation in holds:
        by_allocation.setdefault(str(allocation), set()).add((str(node), str(device)))
    states = {str(i): str(s) for i, s, _ in rows}
    assert set(by_allocation) <= {i for i, s in states.items() if s in LIVE}, (
        "an ended allocation holds devices"
    )
    for allocation_id, state, placement in rows:
        if state not in LIVE:
            continue
        wanted = set()
        for task in json.loads(placement)["tasks"]:
            devices = task["mig_uuids"] or task["gpu_uuids"]
            wanted |= {(task["node"], d) for d in devices}
            wanted |= {(task["node"], f"cpu:{c}") for c in task["cpus"]}
        assert by_allocation.get(str(allocation_id), set()) == wanted, (
            f"live allocation {allocation_id} ({state}) holds other devices than it was given"
        )
    held = {(n, d) for n, d, _ in holds if not str(d).startswith("cpu:")}
    return {(str(n), str(d)) for n, d in held}, states


def replica_view(client: httpx.Client) -> set[tuple[str, str]]:
    """What a replica shows busy on healthy GPUs."""
    nodes = client.get("/v1/nodes").json()["nodes"]
    return {
        (n["name"], g["uuid"])
        for n in nodes
        for g in n["gpus"]
        if not g["free"] and g["health"] == "healthy"
    }


def _consistent_read(engine: sa.Engine) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Allocations and holds as of one moment: the holds read between two equal reads
    of the allocations. Every transition changes an allocation row in the transaction
    that changes its holds, so equal reads mean no such transaction committed between
    them (a sweep may expire reservations while the check runs)."""
    allocations, holds = schema.allocations, schema.gpu_holds
    query = sa.select(allocations.c.id, allocations.c.state, allocations.c.placement)
    while True:
        with engine.connect() as conn:
            before = conn.execute(query).all()
            held = conn.execute(
                sa.select(holds.c.node, holds.c.device, holds.c.allocation_id)
            ).all()
            after = conn.execute(query).all()
        if sorted(before) == sorted(after):
            return [tuple(r) for r in before], [tuple(r) for r in held]
