"""Initial schema: nodes, snapshot history, allocations, GPU holds.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("name", sa.String(253), primary_key=True),
        sa.Column("region", sa.String(63), nullable=False),
        sa.Column("snapshot", sa.Text, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("signature", sa.Text, nullable=True),
        sa.Column("cordoned", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "node_snapshots",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column(
            "node",
            sa.String(253),
            sa.ForeignKey("nodes.name", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("snapshot", sa.Text, nullable=False),
        sa.Column("signature", sa.Text, nullable=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_node_snapshots_node_id", "node_snapshots", ["node", "id"])
    op.create_table(
        "allocations",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(256), nullable=True),
        sa.Column("owner", sa.String(256), nullable=True),
        sa.Column("idempotency_key", sa.String(256), nullable=True, unique=True),
        sa.Column("request", sa.Text, nullable=False),
        sa.Column("placement", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_allocations_job_id", "allocations", ["job_id"])
    op.create_index("ix_allocations_state", "allocations", ["state"])
    op.create_table(
        "gpu_holds",
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("device", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column(
            "allocation_id",
            sa.String(36),
            sa.ForeignKey("allocations.id", ondelete="CASCADE"),
            nullable=False,
        ),
    )
    op.create_index("ix_gpu_holds_allocation", "gpu_holds", ["allocation_id"])


def downgrade() -> None:
    op.drop_table("gpu_holds")
    op.drop_table("allocations")
    op.drop_table("node_snapshots")
    op.drop_table("nodes")
