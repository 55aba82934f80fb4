"""A forwarded key remembers the request it was sent for: ``federation_forwards.request``.

The region a key went to sees only what is forwarded: the request without its
``federation`` options, with the GPU model the key was priced on. A key sent
again for another request (other regions, another model, a lower budget) was
forwarded there as the first request and answered with the first allocation,
which the new request does not meet. The global service now keeps the request
(without ``federation.deadline_s``, the caller's patience) and refuses a key
sent again with another one, 409 ``conflict``, as ``/v1/place`` does. NULL: a
key forwarded before this revision, whose request is not known (not checked).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("federation_forwards", sa.Column("request", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("federation_forwards", "request")
