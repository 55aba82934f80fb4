"""The one promise, read back: what the database holds, checked, and what a replica shows."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import sqlalchemy as sa

from service import schema

LIVE = set(schema.LIVE_STATES)
FULL_SHARE = 1000


@dataclass(frozen=True)
class _Rows:
    allocations: list[tuple[Any, ...]]  # (id, state, placement)
    holds: list[tuple[Any, ...]]  # (node, device, allocation_id, kind, share_milli, instances)
    shares: list[tuple[Any, ...]]  # (node, device, allocation_id, milli)


def database_view(engine: sa.Engine) -> tuple[set[tuple[str, str]], dict[str, str]]:
    """(held (node, GPU or MIG uuid, whole or shared), state by allocation id), after
    checking the database's own promise: holds and shares only for live allocations,
    exactly their devices, and each shared GPU's pool the sum of its shares."""
    held, _, states = database_shares_view(engine)
    return held, states


def database_shares_view(
    engine: sa.Engine,
) -> tuple[set[tuple[str, str]], dict[tuple[str, str], int], dict[str, str]]:
    """``database_view`` with the thousandths held on each shared GPU."""
    rows = _consistent_read(engine)
    by_allocation: dict[str, set[tuple[str, str]]] = {}
    pools: dict[tuple[str, str], int] = {}
    mig_pools: dict[tuple[str, str], int] = {}
    for node, device, allocation, kind, milli, instances in rows.holds:
        if kind == schema.SHARED:
            assert allocation is None, f"the pool of {node}/{device} names an allocation"
            pools[(str(node), str(device))] = int(milli)
        elif kind == schema.MIG_POOL:
            assert allocation is None, f"the MIG pool of {node}/{device} names an allocation"
            mig_pools[(str(node), str(device))] = int(instances)
        else:
            by_allocation.setdefault(str(allocation), set()).add((str(node), str(device)))
    _check_mig_pools(rows, mig_pools)
    summed: dict[tuple[str, str], int] = {}
    for node, device, allocation, milli in rows.shares:
        by_allocation.setdefault(str(allocation), set()).add((str(node), str(device)))
        summed[(str(node), str(device))] = summed.get((str(node), str(device)), 0) + int(milli)
    assert summed == pools, f"share pools {pools} are not the sums of their shares {summed}"
    assert all(0 < milli <= FULL_SHARE for milli in pools.values()), f"a pool past 1000: {pools}"
    states = {str(i): str(s) for i, s, _ in rows.allocations}
    assert set(by_allocation) <= {i for i, s in states.items() if s in LIVE}, (
        "an ended allocation holds devices"
    )
    for allocation_id, state, placement in rows.allocations:
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
    held = {
        (str(n), str(d))
        for n, d, _, kind, _, _ in rows.holds
        if not str(d).startswith("cpu:") and kind != schema.MIG_POOL
    }
    return held, pools, states


def _check_mig_pools(rows: _Rows, mig_pools: dict[tuple[str, str], int]) -> None:
    """Each MIG pool counts its GPU's held instances, and a GPU held whole or in shares
    has none held: the one GPU is never in two live allocations that way either."""
    counted: dict[tuple[str, str], int] = {}
    for _, state, placement in rows.allocations:
        if state not in LIVE:
            continue
        for task in json.loads(placement)["tasks"]:
            for _ in task["mig_uuids"]:
                key = (str(task["node"]), str(task["gpu_uuids"][0]))
                counted[key] = counted.get(key, 0) + 1
    assert counted == mig_pools, f"MIG pools {mig_pools} do not count the instances {counted}"
    whole = {(str(n), str(d)) for n, d, _, kind, _, _ in rows.holds if kind in ("gpu", "shared")}
    assert not whole & set(counted), f"GPUs held whole and by instance: {whole & set(counted)}"


def replica_view(client: httpx.Client) -> set[tuple[str, str]]:
    """What a replica shows busy on healthy GPUs (held whole or in shares)."""
    return set(replica_shares_view(client)[0])


def replica_shares_view(
    client: httpx.Client,
) -> tuple[set[tuple[str, str]], dict[tuple[str, str], int]]:
    """``replica_view`` with the thousandths it shows held on each healthy shared GPU."""
    nodes = client.get("/v1/nodes").json()["nodes"]
    healthy = [(n["name"], g) for n in nodes for g in n["gpus"] if g["health"] == "healthy"]
    busy = {(name, g["uuid"]) for name, g in healthy if not g["free"]}
    shares = {(name, g["uuid"]): int(g["share_milli"]) for name, g in healthy if g["share_milli"]}
    return busy, shares


def _consistent_read(engine: sa.Engine) -> _Rows:
    """Allocations, holds and shares as of one moment: the holds and shares read between
    two equal reads of the allocations. Every transition changes an allocation row in
    the transaction that changes its holds and shares, so equal reads mean no such
    transaction committed between them (a sweep may expire reservations while the check
    runs)."""
    allocations, holds, shares = schema.allocations, schema.gpu_holds, schema.gpu_shares
    query = sa.select(allocations.c.id, allocations.c.state, allocations.c.placement)
    hold_query = sa.select(
        holds.c.node,
        holds.c.device,
        holds.c.allocation_id,
        holds.c.kind,
        holds.c.share_milli,
        holds.c.instances,
    )
    share_query = sa.select(shares.c.node, shares.c.device, shares.c.allocation_id, shares.c.milli)
    while True:
        with engine.connect() as conn:
            before = conn.execute(query).all()
            held = conn.execute(hold_query).all()
            shared = conn.execute(share_query).all()
            after = conn.execute(query).all()
        if sorted(before) == sorted(after):
            return _Rows(
                [tuple(r) for r in before], [tuple(r) for r in held], [tuple(r) for r in shared]
            )
