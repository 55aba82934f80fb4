"""The audit log: placements, allocation changes, admin actions, refused snapshots.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("actor_id", sa.String(64), nullable=True),
        sa.Column("actor_name", sa.String(256), nullable=False, server_default=""),
        sa.Column("actor_role", sa.String(16), nullable=True),
        sa.Column("route", sa.String(128), nullable=False),
        sa.Column("nodes", sa.Text, nullable=False, server_default=""),
        sa.Column("job_id", sa.String(256), nullable=True),
        sa.Column("allocation_id", sa.String(36), nullable=True),
        sa.Column("detail", sa.Text, nullable=False, server_default="{}"),
    )
    op.create_index("ix_audit_log_at", "audit_log", ["at"])
    op.create_index("ix_audit_log_allocation_id", "audit_log", ["allocation_id"])
    op.create_index("ix_audit_log_job_id", "audit_log", ["job_id"])
    op.create_index("ix_audit_log_actor_id", "audit_log", ["actor_id"])


def downgrade() -> None:
    op.drop_table("audit_log")
