"""A GPU whose MIG instances are held has a pool row: ``gpu_holds`` of kind ``migpool``,
keyed by the GPU's UUID, counting its instances' holds (``instances``); each instance's
hold names its GPU (``parent``).

A whole GPU's hold and an instance's hold named different devices, so both could
commit: a scheduler's truth that a job runs on a MIG-mode GPU whole, through one
replica, and a reservation of one of its instances through another that had not
heard of it. The pool shares its key with the whole GPU's hold, and the hold shape
check admits neither row turned into the other: the second to commit fails
(service/allocations/pools.py). Existing instance holds get their GPU from their
allocation's placement, and their pools are made with their count.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-07
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

OLD_SHAPE = (
    "(kind = 'shared' AND allocation_id IS NULL AND share_milli IS NOT NULL"
    " AND share_milli >= 0 AND share_milli <= 1000)"
    " OR (kind <> 'shared' AND allocation_id IS NOT NULL AND share_milli IS NULL)"
)
NEW_SHAPE = (
    "(kind = 'shared' AND allocation_id IS NULL AND share_milli IS NOT NULL"
    " AND share_milli >= 0 AND share_milli <= 1000"
    " AND instances IS NULL AND parent IS NULL)"
    " OR (kind = 'migpool' AND allocation_id IS NULL AND share_milli IS NULL"
    " AND instances IS NOT NULL AND instances >= 0 AND parent IS NULL)"
    " OR (kind NOT IN ('shared', 'migpool') AND allocation_id IS NOT NULL"
    " AND share_milli IS NULL AND instances IS NULL AND (kind = 'mig' OR parent IS NULL))"
)


def upgrade() -> None:
    with op.batch_alter_table("gpu_holds") as batch:
        batch.add_column(sa.Column("instances", sa.Integer, nullable=True))
        batch.add_column(sa.Column("parent", sa.String(128), nullable=True))
        batch.drop_constraint("ck_gpu_holds_shape", type_="check")
        batch.create_check_constraint("ck_gpu_holds_shape", NEW_SHAPE)
    conn = op.get_bind()
    holds = sa.table(
        "gpu_holds",
        *(
            sa.column(c)
            for c in ("node", "device", "kind", "allocation_id", "live", "instances", "parent")
        ),
    )
    allocations = sa.table("allocations", sa.column("id"), sa.column("placement"))
    found = conn.execute(
        sa.select(holds.c.node, holds.c.device, allocations.c.placement)
        .join(allocations, allocations.c.id == holds.c.allocation_id)
        .where(holds.c.kind == "mig")
    ).all()
    parents: dict[tuple[str, str], str] = {}
    for node, device, placement in found:
        try:
            tasks = json.loads(placement).get("tasks", ())
        except (ValueError, AttributeError):
            continue  # an unreadable placement: its hold stays without a pool, as before
        for task in tasks:
            gpus = task.get("gpu_uuids") or ()
            if task.get("node") == node and device in (task.get("mig_uuids") or ()) and gpus:
                parents[(str(node), str(device))] = str(gpus[0])
    if not parents:
        return
    conn.execute(
        sa.update(holds)
        .where(holds.c.node == sa.bindparam("n"), holds.c.device == sa.bindparam("d"))
        .values(parent=sa.bindparam("p")),
        [{"n": n, "d": d, "p": p} for (n, d), p in sorted(parents.items())],
    )
    counted: dict[tuple[str, str], int] = {}
    for (node, _), gpu in parents.items():
        counted[(node, gpu)] = counted.get((node, gpu), 0) + 1
    # A GPU also held whole (a race this revision closes) keeps its whole hold: its
    # instances' pool cannot be written beside it, and the instances stay as they were.
    whole = {
        (str(n), str(d))
        for n, d in conn.execute(
            sa.select(holds.c.node, holds.c.device).where(holds.c.kind != "mig")
        )
    }
    pools = [
        {"node": n, "device": g, "kind": "migpool", "live": True, "instances": c}
        for (n, g), c in sorted(counted.items())
        if (n, g) not in whole
    ]
    if pools:
        conn.execute(sa.insert(holds), pools)
    stranded = [(n, d) for (n, d), g in parents.items() if (n, g) in whole]
    if stranded:
        conn.execute(
            sa.update(holds)
            .where(holds.c.node == sa.bindparam("n"), holds.c.device == sa.bindparam("d"))
            .values(parent=None),
            [{"n": n, "d": d} for n, d in sorted(stranded)],
        )


def downgrade() -> None:
    op.execute("DELETE FROM gpu_holds WHERE kind = 'migpool'")
    if op.get_bind().dialect.name == "postgresql":
        # The deferred keys are checked now: Postgres alters no table with checks pending.
        op.execute("SET CONSTRAINTS ALL IMMEDIATE")
    with op.batch_alter_table("gpu_holds") as batch:
        batch.drop_constraint("ck_gpu_holds_shape", type_="check")
        batch.create_check_constraint("ck_gpu_holds_shape", OLD_SHAPE)
        batch.drop_column("parent")
        batch.drop_column("instances")
    if op.get_bind().dialect.name == "postgresql":
        # Back as every deferrable key is declared, for the revisions undone after this
        # one in the same transaction.
        op.execute("SET CONSTRAINTS ALL DEFERRED")
