"""A live reservation remembers when a caller last reused it: ``allocations.touched_at``.

The Kubernetes reconciler reads the live reservations, lists the pods and
releases a reservation whose pod is unbound or gone. A bind retried in
between reused such a reservation and wrote its Binding; the pass then
released it from its older list, and the pod ran on GPUs the service thought
free. A bind (or a gang member's claim) now stamps the reservation it
reuses, before its Binding, and the reconciler's release is guarded: it ends
only a reservation neither made nor stamped since the pass's cutoff. NULL:
never reused (its ``created_at`` counts).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("allocations", sa.Column("touched_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("allocations", "touched_at")
