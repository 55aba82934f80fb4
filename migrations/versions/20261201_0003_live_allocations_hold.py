"""A live allocation and its holds, kept together by the database.

Adds ``allocations.live`` and the anchor columns, ``gpu_holds.live``, the
checks that tie them to the state and the expiry, and the two deferred
foreign keys between the tables (service/schema.py says what each one
forbids). The old foreign key from a hold to its allocation, with ON DELETE
CASCADE, is replaced by the one to ``allocations(id, live)``.

Rows that break the new rules are mended first, so the constraints can be
added: holds of ended allocations are deleted, live allocations that hold
nothing (left behind by the lifecycle races this revision closes) are ended
as ``released``, active allocations lose their expiry and pending ones
without an expiry get one at once.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op
from alembic.operations import BatchOperations

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

LIVE = ("pending", "active", "degraded")
ENDED = ("released", "expired")
# SQLite's foreign keys carry no names; batch mode names the reflected ones by this.
NAMING = {"fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"}


def _quoted(states: tuple[str, ...]) -> str:
    return ", ".join(f"'{s}'" for s in states)


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    with op.batch_alter_table("allocations") as batch:
        batch.add_column(sa.Column("live", sa.Boolean(create_constraint=False), nullable=True))
        batch.add_column(sa.Column("anchor_node", sa.String(253), nullable=True))
        batch.add_column(sa.Column("anchor_device", sa.String(128), nullable=True))
    with op.batch_alter_table("gpu_holds") as batch:
        batch.add_column(
            sa.Column(
                "live",
                sa.Boolean(create_constraint=False),
                nullable=False,
                server_default=sa.true(),
            )
        )
    _mend()
    # One batch a table where SQLite must copy it, so nothing added in one copy is
    # lost by the next; SQLite checks what a foreign key names only when rows are
    # written, Postgres when the key is made, so there the anchor comes last.
    with op.batch_alter_table("allocations") as batch:
        batch.create_unique_constraint("uq_allocations_id_live", ["id", "live"])
        batch.create_check_constraint(
            "ck_allocations_live",
            f"(state IN ({_quoted(LIVE)}) AND live = true"
            " AND anchor_node IS NOT NULL AND anchor_device IS NOT NULL)"
            f" OR (state IN ({_quoted(ENDED)}) AND live IS NULL"
            " AND anchor_node IS NULL AND anchor_device IS NULL AND ended_at IS NOT NULL)",
        )
        batch.create_check_constraint(
            "ck_allocations_expiry",
            "(state <> 'pending' OR expires_at IS NOT NULL)"
            " AND (state <> 'active' OR expires_at IS NULL)",
        )
        if sqlite:
            _anchor(batch)
    with op.batch_alter_table("gpu_holds", naming_convention=NAMING) as batch:
        batch.drop_constraint(
            "fk_gpu_holds_allocation_id_allocations" if sqlite else "gpu_holds_allocation_id_fkey",
            type_="foreignkey",
        )
        batch.create_unique_constraint(
            "uq_gpu_holds_node_device_alloc", ["node", "device", "allocation_id"]
        )
        batch.create_check_constraint("ck_gpu_holds_live", "live = true")
        batch.create_foreign_key(
            "fk_gpu_holds_live_allocation",
            "allocations",
            ["allocation_id", "live"],
            ["id", "live"],
            deferrable=True,
            initially="DEFERRED",
        )
    if not sqlite:
        with op.batch_alter_table("allocations") as batch:
            _anchor(batch)


def _anchor(batch: BatchOperations) -> None:
    batch.create_foreign_key(
        "fk_allocations_anchor",
        "gpu_holds",
        ["anchor_node", "anchor_device", "id"],
        ["node", "device", "allocation_id"],
        deferrable=True,
        initially="DEFERRED",
    )


def _mend() -> None:
    """Bring existing rows within the new rules (see the module's text)."""
    allocations = sa.table(
        "allocations",
        sa.column("id", sa.String),
        sa.column("state", sa.String),
        sa.column("expires_at", sa.DateTime(timezone=True)),
        sa.column("ended_at", sa.DateTime(timezone=True)),
        sa.column("created_at", sa.DateTime(timezone=True)),
        sa.column("live", sa.Boolean),
        sa.column("anchor_node", sa.String),
        sa.column("anchor_device", sa.String),
    )
    holds = sa.table(
        "gpu_holds",
        sa.column("node", sa.String),
        sa.column("device", sa.String),
        sa.column("allocation_id", sa.String),
    )
    now = datetime.now(UTC)
    live_ids = sa.select(allocations.c.id).where(allocations.c.state.in_(LIVE))
    op.execute(sa.delete(holds).where(holds.c.allocation_id.not_in(live_ids)))
    holding = sa.select(holds.c.allocation_id)
    op.execute(
        sa.update(allocations)
        .where(allocations.c.state.in_(LIVE), allocations.c.id.not_in(holding))
        .values(state="released", expires_at=None)
    )
    op.execute(
        sa.update(allocations)
        .where(allocations.c.state.in_(ENDED), allocations.c.ended_at.is_(None))
        .values(ended_at=now)
    )
    op.execute(
        sa.update(allocations)
        .where(allocations.c.state.in_(ENDED))
        .values(live=None, anchor_node=None, anchor_device=None, expires_at=None)
    )
    first = (
        sa.select(holds.c.node, holds.c.device)
        .where(holds.c.allocation_id == allocations.c.id)
        .order_by(holds.c.node, holds.c.device)
        .limit(1)
    )
    op.execute(
        sa.update(allocations)
        .where(allocations.c.state.in_(LIVE))
        .values(
            live=True,
            anchor_node=first.with_only_columns(holds.c.node).scalar_subquery(),
            anchor_device=first.with_only_columns(holds.c.device).scalar_subquery(),
        )
    )
    op.execute(
        sa.update(allocations).where(allocations.c.state == "active").values(expires_at=None)
    )
    op.execute(
        sa.update(allocations)
        .where(allocations.c.state == "pending", allocations.c.expires_at.is_(None))
        .values(expires_at=allocations.c.created_at)
    )


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    with op.batch_alter_table("gpu_holds") as batch:
        batch.drop_constraint("fk_gpu_holds_live_allocation", type_="foreignkey")
    with op.batch_alter_table("allocations") as batch:
        batch.drop_constraint("fk_allocations_anchor", type_="foreignkey")
        batch.drop_constraint("ck_allocations_expiry", type_="check")
        batch.drop_constraint("ck_allocations_live", type_="check")
        batch.drop_constraint("uq_allocations_id_live", type_="unique")
        batch.drop_column("anchor_device")
        batch.drop_column("anchor_node")
        batch.drop_column("live")
    with op.batch_alter_table("gpu_holds") as batch:
        batch.drop_constraint("ck_gpu_holds_live", type_="check")
        batch.drop_constraint("uq_gpu_holds_node_device_alloc", type_="unique")
        batch.drop_column("live")
        batch.create_foreign_key(
            None if sqlite else "gpu_holds_allocation_id_fkey",
            "allocations",
            ["allocation_id"],
            ["id"],
            ondelete="CASCADE",
        )
