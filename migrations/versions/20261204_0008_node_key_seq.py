"""Node keys remember the newest seq taken under them: ``node_keys.seq``.

A keyed node's snapshot must carry a seq newer than the stored one. The
stored seq lived only in the node's row, so once an operator deleted the
node (``DELETE /v1/nodes/{name}``) its last signed snapshot, sent again,
verified against the key that stays registered and brought the node back.
The key's row now keeps that seq too; it starts empty for a key registered
anew. Existing keys take the seq of their node's signed snapshot.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("node_keys", sa.Column("seq", sa.BigInteger, nullable=True))
    op.execute(
        "UPDATE node_keys SET seq = (SELECT nodes.seq FROM nodes"
        " WHERE nodes.name = node_keys.node AND nodes.signature IS NOT NULL)"
    )


def downgrade() -> None:
    with op.batch_alter_table("node_keys") as batch:
        batch.drop_column("seq")
