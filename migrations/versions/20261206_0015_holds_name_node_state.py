"""A reservation's holds name the node's row as chosen on: ``gpu_holds.node_reported_at``
and ``node_cordoned``.

A cordon was written to the node row and into the memory of the replica that
took it; another replica placed on the node until it heard of it (its
notification, or the next resync), after the cordon had answered. And a node
deleted and reported again under its old seq with other GPUs matched the holds'
``node_seq`` key: a replica that had not heard of either held UUIDs the node no
longer had. Each hold a reservation writes now also carries the reported_at of
the snapshot it was chosen on and ``node_cordoned`` false, with a foreign key
to ``nodes(name, reported_at, cordoned)`` (hence the unique index): a cordon,
or another snapshot row, committed since makes the commit fail, and the request
is decided again on the stored state. A report, cordon or uncordon carries the
holds committed before it along (ON UPDATE CASCADE). Existing holds, and holds
recorded from what a scheduler runs, name none.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "uq_nodes_name_reported_cordoned",
        "nodes",
        ["name", "reported_at", "cordoned"],
        unique=True,
    )
    with op.batch_alter_table("gpu_holds") as batch:
        batch.add_column(sa.Column("node_reported_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(
            sa.Column("node_cordoned", sa.Boolean(create_constraint=False), nullable=True)
        )
        batch.create_foreign_key(
            "fk_gpu_holds_node_state",
            "nodes",
            ["node", "node_reported_at", "node_cordoned"],
            ["name", "reported_at", "cordoned"],
            onupdate="CASCADE",
            deferrable=True,
            initially="DEFERRED",
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_holds") as batch:
        batch.drop_constraint("fk_gpu_holds_node_state", type_="foreignkey")
        batch.drop_column("node_cordoned")
        batch.drop_column("node_reported_at")
    op.drop_index("uq_nodes_name_reported_cordoned", table_name="nodes")
