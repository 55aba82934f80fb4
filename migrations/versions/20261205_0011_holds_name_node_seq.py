"""Holds name the node snapshot they were chosen on: ``gpu_holds.node_seq``.

A reservation is chosen in memory and committed after; a snapshot report
that dropped or broke one of its GPUs could commit in between (on this replica
while the commit waited, or on another replica whose memory had not caught up),
and the reservation then held a GPU that was gone. Each hold a reservation
writes now carries the seq of the node's snapshot it was chosen on, with a
foreign key to ``nodes(name, seq)`` (hence the unique index): a snapshot
replaced since makes the commit fail, and the request is decided again. A newer
snapshot carries the holds committed before it along (ON UPDATE CASCADE).
Existing holds, and holds recorded from what a scheduler runs, name none.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("uq_nodes_name_seq", "nodes", ["name", "seq"], unique=True)
    with op.batch_alter_table("gpu_holds") as batch:
        batch.add_column(sa.Column("node_seq", sa.BigInteger, nullable=True))
        batch.create_foreign_key(
            "fk_gpu_holds_node_seq",
            "nodes",
            ["node", "node_seq"],
            ["name", "seq"],
            onupdate="CASCADE",
            deferrable=True,
            initially="DEFERRED",
        )


def downgrade() -> None:
    with op.batch_alter_table("gpu_holds") as batch:
        batch.drop_constraint("fk_gpu_holds_node_seq", type_="foreignkey")
        batch.drop_column("node_seq")
    op.drop_index("uq_nodes_name_seq", table_name="nodes")
