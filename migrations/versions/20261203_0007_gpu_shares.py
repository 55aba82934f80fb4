"""GPU shares: a pool row per shared GPU in ``gpu_holds``, one ``gpu_shares`` row a share.

- ``gpu_holds.allocation_id`` may be NULL, for a share pool (kind ``shared``),
  and ``gpu_holds.share_milli`` counts the thousandths its shares hold; a
  check admits only the two shapes of row (a pool, or a hold of one
  allocation), and (node, device, kind) is unique, for the shares' key.
- ``gpu_shares``: (node, device, allocation_id, kind, milli, live), keyed
  to its pool and, as a hold is, to a live allocation.
- ``allocations.share_node`` / ``share_device``: a share allocation's
  anchor, its own share row; the live check asks for exactly one anchor.

service/schema.py says what each rule forbids. No row changes: every
existing hold has an allocation and no pool count, and every live
allocation its hold anchor.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

LIVE = "'pending', 'active', 'degraded'"
ENDED = "'released', 'expired'"
OLD_LIVE = (
    f"(state IN ({LIVE}) AND live = true"
    " AND anchor_node IS NOT NULL AND anchor_device IS NOT NULL)"
    f" OR (state IN ({ENDED}) AND live IS NULL"
    " AND anchor_node IS NULL AND anchor_device IS NULL AND ended_at IS NOT NULL)"
)
NEW_LIVE = (
    f"(state IN ({LIVE}) AND live = true AND ("
    "(anchor_node IS NOT NULL AND anchor_device IS NOT NULL"
    " AND share_node IS NULL AND share_device IS NULL)"
    " OR (anchor_node IS NULL AND anchor_device IS NULL"
    " AND share_node IS NOT NULL AND share_device IS NOT NULL)))"
    f" OR (state IN ({ENDED}) AND live IS NULL"
    " AND anchor_node IS NULL AND anchor_device IS NULL"
    " AND share_node IS NULL AND share_device IS NULL AND ended_at IS NOT NULL)"
)
HOLD_SHAPE = (
    "(kind = 'shared' AND allocation_id IS NULL AND share_milli IS NOT NULL"
    " AND share_milli >= 0 AND share_milli <= 1000)"
    " OR (kind <> 'shared' AND allocation_id IS NOT NULL AND share_milli IS NULL)"
)
SHARE_SHAPE = "kind = 'shared' AND live = true AND milli > 0 AND milli <= 1000"


def upgrade() -> None:
    with op.batch_alter_table("gpu_holds") as batch:
        batch.alter_column("allocation_id", existing_type=sa.String(36), nullable=True)
        batch.add_column(sa.Column("share_milli", sa.Integer, nullable=True))
        batch.create_unique_constraint("uq_gpu_holds_node_device_kind", ["node", "device", "kind"])
        batch.create_check_constraint("ck_gpu_holds_shape", HOLD_SHAPE)
    op.create_table(
        "gpu_shares",
        sa.Column("node", sa.String(253), primary_key=True),
        sa.Column("device", sa.String(128), primary_key=True),
        sa.Column("allocation_id", sa.String(36), primary_key=True),
        sa.Column("kind", sa.String(8), nullable=False, server_default="shared"),
        sa.Column("milli", sa.Integer, nullable=False),
        sa.Column(
            "live",
            sa.Boolean(create_constraint=False),
            nullable=False,
            server_default=sa.true(),
        ),
        sa.CheckConstraint(SHARE_SHAPE, name="ck_gpu_shares_shape"),
        sa.ForeignKeyConstraint(
            ["node", "device", "kind"],
            ["gpu_holds.node", "gpu_holds.device", "gpu_holds.kind"],
            name="fk_gpu_shares_pool",
            deferrable=True,
            initially="DEFERRED",
        ),
        sa.ForeignKeyConstraint(
            ["allocation_id", "live"],
            ["allocations.id", "allocations.live"],
            name="fk_gpu_shares_live_allocation",
            deferrable=True,
            initially="DEFERRED",
        ),
    )
    op.create_index("ix_gpu_shares_allocation", "gpu_shares", ["allocation_id"])
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("share_node", sa.String(253), nullable=True))
        batch.add_column(sa.Column("share_device", sa.String(128), nullable=True))
        batch.drop_constraint("ck_allocations_live", type_="check")
        batch.create_check_constraint("ck_allocations_live", NEW_LIVE)
        batch.create_foreign_key(
            "fk_allocations_share_anchor",
            "gpu_shares",
            ["share_node", "share_device", "id"],
            ["node", "device", "allocation_id"],
            deferrable=True,
            initially="DEFERRED",
        )


def downgrade() -> None:
    # Share allocations end as released: the schema before this one cannot hold them.
    op.execute(
        "UPDATE allocations SET state = 'released', live = NULL, share_node = NULL,"
        " share_device = NULL, expires_at = NULL,"
        " ended_at = COALESCE(ended_at, CURRENT_TIMESTAMP) WHERE share_node IS NOT NULL"
    )
    op.execute(
        "DELETE FROM gpu_holds WHERE allocation_id IN (SELECT allocation_id FROM gpu_shares)"
    )
    op.execute("DELETE FROM gpu_shares")
    op.execute("DELETE FROM gpu_holds WHERE kind = 'shared'")
    if op.get_bind().dialect.name == "postgresql":
        # The deferred keys are checked now: Postgres alters no table with checks pending.
        op.execute("SET CONSTRAINTS ALL IMMEDIATE")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_constraint("fk_allocations_share_anchor", type_="foreignkey")
        batch.drop_constraint("ck_allocations_live", type_="check")
        batch.create_check_constraint("ck_allocations_live", OLD_LIVE)
        batch.drop_column("share_device")
        batch.drop_column("share_node")
    op.drop_index("ix_gpu_shares_allocation", "gpu_shares")
    op.drop_table("gpu_shares")
    with op.batch_alter_table("gpu_holds") as batch:
        batch.drop_constraint("ck_gpu_holds_shape", type_="check")
        batch.drop_constraint("uq_gpu_holds_node_device_kind", type_="unique")
        batch.drop_column("share_milli")
        batch.alter_column("allocation_id", existing_type=sa.String(36), nullable=False)
