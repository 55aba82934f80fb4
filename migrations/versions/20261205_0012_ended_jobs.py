"""Jobs whose end was said: ``ended_jobs``.

A Slurm prolog's report of a job's start could be processed after the job's
epilog (or after the reconcile loop released the ended job), and then made an
allocation for a dead job over the GPUs the next job held. The epilog's release
by job id and the reconcile loop's release of an ended job now remember the
job id for a while; a report of its start processed meanwhile records nothing.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ended_jobs",
        sa.Column("job_id", sa.String(256), primary_key=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_ended_jobs_ended_at", "ended_jobs", ["ended_at"])


def downgrade() -> None:
    op.drop_index("ix_ended_jobs_ended_at", table_name="ended_jobs")
    op.drop_table("ended_jobs")
