"""Node public keys: the Ed25519 key each node's agent signs its snapshots with.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "node_keys",
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("algorithm", sa.String(16), nullable=False),
        sa.Column("public_key", sa.Text, nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_keys")
