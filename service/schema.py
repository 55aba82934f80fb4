"""The database schema, as SQLAlchemy Core tables.

The schema changes only through Alembic migrations in ``migrations/``; these
tables are what the code reads and writes, and a test checks that the
migrated database matches them.

The last line of defence against double booking is ``gpu_holds``: one row
per GPU (or MIG instance) held by a live allocation, primary key (node,
device). Two replicas racing for a GPU cannot both insert its row; the loser
gets an integrity error and retries on fresh state. Rows are deleted when
the allocation is released or expires.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("name", sa.String(253), primary_key=True),
    sa.Column("region", sa.String(63), nullable=False),
    sa.Column("snapshot", sa.Text, nullable=False),  # NodeSnapshot JSON
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("signature", sa.Text, nullable=True),
    sa.Column("cordoned", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
)

node_snapshots = sa.Table(
    "node_snapshots",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column(
        "node", sa.String(253), sa.ForeignKey("nodes.name", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("snapshot", sa.Text, nullable=False),
    sa.Column("signature", sa.Text, nullable=True),
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_node_snapshots_node_id", "node", "id"),
)

allocations = sa.Table(
    "allocations",
    metadata,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("state", sa.String(16), nullable=False),  # pending|active|degraded|released|expired
    sa.Column("job_id", sa.String(256), nullable=True),
    sa.Column("owner", sa.String(256), nullable=True),
    sa.Column("idempotency_key", sa.String(256), nullable=True, unique=True),
    sa.Column("request", sa.Text, nullable=False),  # PlacementRequest JSON
    sa.Column("placement", sa.Text, nullable=False),  # the engine's placement, JSON
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    sa.Index("ix_allocations_job_id", "job_id"),
    sa.Index("ix_allocations_state", "state"),
)

gpu_holds = sa.Table(
    "gpu_holds",
    metadata,
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("device", sa.String(128), primary_key=True),  # GPU or MIG instance UUID
    sa.Column("kind", sa.String(8), nullable=False),  # gpu | mig | cpu (device "cpu:N")
    sa.Column(
        "allocation_id",
        sa.String(36),
        sa.ForeignKey("allocations.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Index("ix_gpu_holds_allocation", "allocation_id"),
)

# One public key per node name, registered by the node's agent (trust on
# first use: a different key is refused until the old one is deleted). Not
# tied to `nodes`: an agent registers its key before its first snapshot.
node_keys = sa.Table(
    "node_keys",
    metadata,
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("algorithm", sa.String(16), nullable=False),
    sa.Column("public_key", sa.Text, nullable=False),  # base64 of the raw key
    sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
)
