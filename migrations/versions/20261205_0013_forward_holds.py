"""A forwarded Idempotency-Key is held while it is forwarded: ``federation_forwards.holder``
and ``held_until``.

Two requests with the same key on two global replicas (a dispatcher retrying while
its first call still runs) each forwarded on their own: one could be refused by a
region and move the key to the next while the other was placed in the first, one
key with two allocations in two regions. The request forwarding a key now holds
its row until it is done (or its time is up); a twin meanwhile is told the key is
in flight. Existing rows are held by nobody.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("federation_forwards", sa.Column("holder", sa.String(32), nullable=True))
    op.add_column(
        "federation_forwards",
        sa.Column("held_until", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    with op.batch_alter_table("federation_forwards") as batch:
        batch.drop_column("held_until")
        batch.drop_column("holder")
