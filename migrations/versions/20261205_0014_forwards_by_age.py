"""Forwarded keys are found by age: ``ix_federation_forwards_created_at``.

The rows naming which region each Idempotency-Key went to are forgotten once past
their retention (TOPOPLACE_FEDERATION_FORWARD_RETENTION_S), the oldest first, a
batch at a time; the index finds them without reading the whole table each batch.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_federation_forwards_created_at", "federation_forwards", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_federation_forwards_created_at", table_name="federation_forwards")
