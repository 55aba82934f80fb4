"""API tokens with a role and a scope, stored as scrypt hashes (service/tokens/).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("scope", sa.Text, nullable=False, server_default="{}"),
        sa.Column("name", sa.String(256), nullable=False, server_default=""),
        sa.Column("secret_hash", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "role IN ('agent', 'scheduler', 'viewer', 'admin')", name="ck_api_tokens_role"
        ),
    )


def downgrade() -> None:
    op.drop_table("api_tokens")
