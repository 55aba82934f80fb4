"""Holds and shares found by device: ``ix_gpu_holds_device``, ``ix_gpu_shares_device``.

Every snapshot report asks whether a live allocation holds any of the node's
devices on another node (a GPU a node stopped reporting stays held there while
its job may still run on it). Holds are keyed by (node, device), which cannot
serve a look-up by device alone, so without these indexes each report scanned
every hold of the cluster.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_gpu_holds_device", "gpu_holds", ["device"])
    op.create_index("ix_gpu_shares_device", "gpu_shares", ["device"])


def downgrade() -> None:
    op.drop_index("ix_gpu_shares_device", table_name="gpu_shares")
    op.drop_index("ix_gpu_holds_device", table_name="gpu_holds")
