"""Pools: what several allocations hold of one GPU, counted on one ``gpu_holds`` row keyed
by the GPU's UUID, so that no whole-GPU hold can be written beside them.

Two kinds (service/schema.py, ``HOLD_SHAPE``):

- a share pool (kind ``shared``) counts the thousandths its GPU's shares hold;
- a MIG pool (kind ``migpool``) counts the holds of its GPU's MIG instances. An
  instance's hold names its own UUID, a whole GPU's hold the GPU's: without the pool
  both committed, from two replicas (or a truth and a reservation) that each had not
  seen the other's, and one GPU was in two live allocations.

A pool is added to with an upsert and given back to with a decrement, then deleted
at 0: of two transactions ending a GPU's last two holders at once, the second waits on
the first's row lock (Postgres) and then sees 0, so no empty pool is left behind (one
that looked for the other holders first could see the other's still there).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect

from service import schema

SHARED = schema.SHARED
MIG_POOL = schema.MIG_POOL
# A pool's kind -> the column that counts what it holds.
COUNTS = {SHARED: "share_milli", MIG_POOL: "instances"}
_H = schema.gpu_holds
# The columns a pool's upsert writes, the count's among them.
_NODE_STATE = ("node_seq", "node_reported_at", "node_cordoned")


def upsert(dialect: Dialect, kind: str) -> tuple[sa.Insert, list[sa.Column[Any]]]:
    """The statement adding to a pool of ``kind`` (made at 0 + the count when absent), and
    the columns it binds. On any other row of its key (a whole-GPU hold, the other kind of
    pool) the update makes a row of no allowed shape and the transaction is refused."""
    count = COUNTS[kind]
    written = [
        _H.c.node,
        _H.c.device,
        _H.c.kind,
        _H.c.live,
        _H.c[count],
        *(_H.c[c] for c in _NODE_STATE),
    ]
    dialect_insert = postgresql.insert if dialect.name == "postgresql" else sqlite.insert
    insert = dialect_insert(_H).values({c.key: sa.bindparam(c.key) for c in written})
    statement = insert.on_conflict_do_update(
        index_elements=[_H.c.node, _H.c.device],
        set_={
            "kind": insert.excluded.kind,
            count: _H.c[count] + insert.excluded[count],
            # A share pool's node row must be the one the new share was chosen on (its
            # foreign keys); a pool a report or cordon carried along is checked again.
            # A MIG pool names none: its instances' holds do.
            **{c: sa.func.coalesce(insert.excluded[c], _H.c[c]) for c in _NODE_STATE},
        },
    )
    return statement, written


def parents_in(placement: str) -> dict[tuple[str, str], str]:
    """(node, MIG instance UUID) -> its GPU's UUID, read from a placement's JSON: the
    engine and a scheduler's truth place each instance as a task on its GPU."""
    parents: dict[tuple[str, str], str] = {}
    for task in json.loads(placement).get("tasks", ()):
        gpus = task.get("gpu_uuids") or ()
        for instance in task.get("mig_uuids") or ():
            if gpus:
                parents[(str(task.get("node")), str(instance))] = str(gpus[0])
    return parents


def with_parents(holds: Iterable[dict[str, Any]], placement: str) -> list[dict[str, Any]]:
    """Hold rows (dicts), each MIG instance's naming its GPU (``parent``); the placement
    is read only when one is an instance's."""
    rows = list(holds)
    if any(h["kind"] == "mig" for h in rows):
        parents = parents_in(placement)
        for h in rows:
            if h["kind"] == "mig":
                h["parent"] = parents.get((h["node"], h["device"]))
    return rows


def mig_pools(holds: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The MIG pool rows that these hold rows add to, one per GPU, in (node, GPU) order:
    two transactions take their pools' rows in one order."""
    counted: dict[tuple[str, str], int] = {}
    for h in holds:
        if h["kind"] == "mig" and h.get("parent") is not None:
            key = (str(h["node"]), str(h["parent"]))
            counted[key] = counted.get(key, 0) + 1
    return [
        {
            "node": node,
            "device": gpu,
            "kind": MIG_POOL,
            "live": True,
            "instances": n,
            **dict.fromkeys(_NODE_STATE),
        }
        for (node, gpu), n in sorted(counted.items())
    ]


def add_migs(conn: Connection, holds: Sequence[Mapping[str, Any]]) -> None:
    """Count these hold rows' MIG instances in their GPUs' pools (the caller's
    transaction, which inserts the holds)."""
    rows = mig_pools(holds)
    if rows:
        conn.execute(upsert(conn.dialect, MIG_POOL)[0], rows)


def give_back(conn: Connection, kind: str, given: Mapping[tuple[str, str], int]) -> None:
    """Take ``given`` ((node, GPU) -> count) off those pools of ``kind`` and delete the
    pools that reach 0, in (node, GPU) order."""
    if not given:
        return
    count = _H.c[COUNTS[kind]]
    pool = sa.and_(
        _H.c.node == sa.bindparam("pool_node"),
        _H.c.device == sa.bindparam("pool_device"),
        _H.c.kind == kind,
    )
    conn.execute(
        sa.update(_H).where(pool).values({count: count - sa.bindparam("given")}),
        [{"pool_node": n, "pool_device": d, "given": m} for (n, d), m in sorted(given.items())],
    )
    conn.execute(
        sa.delete(_H).where(
            _H.c.kind == kind, count == 0, sa.tuple_(_H.c.node, _H.c.device).in_(sorted(given))
        )
    )


def migs_given(deleted: Iterable[Sequence[Any]]) -> dict[tuple[str, str], int]:
    """(node, GPU) -> the instance holds deleted of it, from deleted hold rows of (node,
    kind, parent); an instance's hold written before its pool existed names no parent."""
    given: dict[tuple[str, str], int] = {}
    for node, kind, parent in deleted:
        if kind == "mig" and parent is not None:
            key = (str(node), str(parent))
            given[key] = given.get(key, 0) + 1
    return given
