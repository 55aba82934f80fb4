"""The newest List each node's device reports were taken from: ``k8s_report_order``.

A device report whose List is older than one taken already for its node and
resource (a report the plugin gave up on, answered after the next round's) is
taken for nothing. That order was one replica's memory: an older report answered
by another replica moved a finished pod's allocation back onto the GPUs the
kubelet had given the next pod. The newest List taken is now the database's,
checked and advanced in the transaction that takes the report.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "k8s_report_order",
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("resource", sa.String(253), primary_key=True),
        sa.Column("listed_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("k8s_report_order")
