"""The one promise, read back: what the database holds, checked, and what a replica shows."""

from __future__ import annotations

import json

import httpx
import sqlalchemy as sa

from service import schema

LIVE = set(schema.LIVE_STATES)


def database_view(engine: sa.Engine) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """(held (node, GPU or MIG uuid), state by allocation id), after checking the
    database's own promise: holds only for live allocations, exactly their devices."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                schema.allocations.c.id, schema.allocations.c.state, schema.allocations.c.placement
            )
        ).all()
        holds = conn.execute(
            sa.select(
                schema.gpu_holds.c.node, schema.gpu_holds.c.device, schema.gpu_holds.c.allocation_id
            )
        ).all()
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
