"""Federation: the regions a global service routes to, and the keys it forwarded.

Adds ``regions`` (one row per registered region, its prices, credentials and
latest signed summary) and ``federation_forwards`` (which region each
Idempotency-Key was forwarded to, so a retried request goes where the first
went), and lets ``api_tokens.role`` be ``region``: a token scoped to one
region that may only push that region's summary (service/access.py).

SQLite cannot alter a CHECK constraint, so there the token table is copied
into one with the new check; Postgres drops and adds the constraint.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

OLD_ROLES = "role IN ('agent', 'scheduler', 'viewer', 'admin')"
NEW_ROLES = "role IN ('agent', 'region', 'scheduler', 'viewer', 'admin')"
TOKEN_COLUMNS = "id, role, scope, name, secret_hash, created_at, revoked_at"


def _token_table(name: str, check: str) -> None:
    op.create_table(
        name,
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("scope", sa.Text, nullable=False, server_default="{}"),
        sa.Column("name", sa.String(256), nullable=False, server_default=""),
        sa.Column("secret_hash", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(check, name="ck_api_tokens_role"),
    )


def _roles(check: str) -> None:
    if op.get_bind().dialect.name == "sqlite":
        _token_table("api_tokens_next", check)
        op.execute(
            f"INSERT INTO api_tokens_next ({TOKEN_COLUMNS}) SELECT {TOKEN_COLUMNS} FROM api_tokens"
        )
        op.drop_table("api_tokens")
        op.rename_table("api_tokens_next", "api_tokens")
        return
    op.drop_constraint("ck_api_tokens_role", "api_tokens", type_="check")
    op.create_check_constraint("ck_api_tokens_role", "api_tokens", check)


def upgrade() -> None:
    op.create_table(
        "regions",
        sa.Column("name", sa.String(63), primary_key=True),
        sa.Column("cloud", sa.String(63), nullable=False),
        sa.Column("location", sa.String(128), nullable=False, server_default=""),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("public_key", sa.Text, nullable=False),
        sa.Column("forward_token", sa.Text, nullable=True),
        sa.Column("token_id", sa.String(32), nullable=False),
        sa.Column("prices", sa.Text, nullable=False),
        sa.Column("egress", sa.Text, nullable=False),
        sa.Column("labels", sa.Text, nullable=False, server_default="{}"),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("summary", sa.Text, nullable=True),
        sa.Column("summary_seq", sa.BigInteger, nullable=True),
        sa.Column("summary_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "federation_forwards",
        sa.Column("idempotency_key", sa.String(256), primary_key=True),
        sa.Column("region", sa.String(63), nullable=False),
        sa.Column("gpu_model", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    _roles(NEW_ROLES)


def downgrade() -> None:
    op.execute("DELETE FROM api_tokens WHERE role = 'region'")
    _roles(OLD_ROLES)
    op.drop_table("federation_forwards")
    op.drop_table("regions")
