"""The database schema, as SQLAlchemy Core tables.

The schema changes only through Alembic migrations in ``migrations/``; these
tables are what the code reads and writes, and a test checks that the
migrated database matches them.

The one promise, a GPU in at most one live allocation and every live
allocation holding exactly its GPUs, is kept by the database itself:

- ``gpu_holds`` has one row per GPU (or MIG instance, or CPU) held, primary
  key (node, device): two replicas racing for a GPU cannot both insert it.
- A hold names its allocation *and* that the allocation is live
  (``live``, always true), through a foreign key to ``allocations(id,
  live)``. An allocation that ends sets ``live`` to NULL, so its holds would
  dangle: ending an allocation without deleting its holds in the same
  transaction cannot commit.
- A live allocation names one of its own holds (``anchor_node``,
  ``anchor_device``) through a foreign key to ``gpu_holds(node, device,
  allocation_id)``: deleting an allocation's holds while it stays live, or
  making a released allocation live again, cannot commit either.
- A reservation's holds name the node snapshot it was chosen on
  (``node_seq``), through a foreign key to ``nodes(name, seq)``: a reservation
  chosen in memory on a snapshot that a newer report replaced (a GPU lost,
  turned unhealthy, split into MIG instances) cannot commit, on whichever
  replica it was chosen; it is decided again on the stored snapshot. So does a
  scheduler's truth (the GPU indices, devices it was mapped on): mapped on a
  replaced snapshot, it is mapped again on the stored one.
- A reservation's holds also name the node's row as it was chosen on: its
  snapshot's ``reported_at`` and the node uncordoned (``node_reported_at``,
  ``node_cordoned`` false), through a foreign key to ``nodes(name,
  reported_at, cordoned)``. A replica that has not heard of a cordon places
  nothing there once the cordon has committed, nor on a node deleted and
  reported again under its old seq with other GPUs (a seq alone does not name
  one content; with ``reported_at`` it does): the commit fails and the
  request is decided again on the stored state. A report, cordon or uncordon
  carries the holds already committed along (ON UPDATE CASCADE), so they stay.
  A scheduler's truth names the row through the same key as it mapped its GPU
  indices or devices on, the cordon as it was (what runs on a cordoned node is
  held): one mapped on a node deleted and reported again under its old seq, or
  that missed a cordon, fails and is mapped again on the stored row.
- A check ties the state to these columns (live states have ``live`` and an
  anchor, ended ones have neither and an end time) and the expiry to the
  state (pending ones expire, active ones never).

- A GPU share (``gpu_fraction``) is a row of ``gpu_shares`` on its GPU's
  pool, a ``gpu_holds`` row of kind ``shared`` that names no allocation and
  counts the thousandths held (``share_milli``). The pool's primary key keeps
  a whole-GPU hold off a shared GPU, and its check keeps a share off a
  whole-GPU hold and the count at or under a whole GPU. A share allocation's
  anchor is its share row (``share_node``, ``share_device``); docs/service.md,
  "GPU shares in the database", says how shares are taken and given back.

The foreign keys are checked at commit (DEFERRABLE INITIALLY DEFERRED), so
a transaction may write the allocation and its holds in either order. The
state transitions themselves are single conditional statements
(service/allocations/repository.py); docs/service.md draws the machine.
"""

from __future__ import annotations

import sqlalchemy as sa

from placement.cluster import FULL_SHARE

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
    # What a reservation's holds name (``gpu_holds.node_seq``): the snapshot it was chosen on.
    sa.Index("uq_nodes_name_seq", "name", "seq", unique=True),
    # And (``gpu_holds.node_reported_at``, ``node_cordoned``) which content, uncordoned.
    sa.Index("uq_nodes_name_reported_cordoned", "name", "reported_at", "cordoned", unique=True),
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

LIVE_STATES = ("pending", "active", "degraded")
SHARED = "shared"  # gpu_holds.kind of a GPU's share pool, and gpu_shares.kind
MIG_POOL = "migpool"  # gpu_holds.kind of a GPU whose MIG instances are held
ENDED_STATES = ("released", "expired")


def _quoted(states: tuple[str, ...]) -> str:
    return ", ".join(f"'{s}'" for s in states)


# A live allocation names exactly one anchor: a hold of its own, or (a share) its share
# row; an ended one names neither. Each term is spelled out: on Postgres a check whose
# value is NULL passes.
ALLOCATIONS_LIVE = (
    f"(state IN ({_quoted(LIVE_STATES)}) AND live = true AND ("
    "(anchor_node IS NOT NULL AND anchor_device IS NOT NULL"
    " AND share_node IS NULL AND share_device IS NULL)"
    " OR (anchor_node IS NULL AND anchor_device IS NULL"
    " AND share_node IS NOT NULL AND share_device IS NOT NULL)))"
    f" OR (state IN ({_quoted(ENDED_STATES)}) AND live IS NULL"
    " AND anchor_node IS NULL AND anchor_device IS NULL"
    " AND share_node IS NULL AND share_device IS NULL AND ended_at IS NOT NULL)"
)
# Three shapes of hold: a share pool (no allocation; 0 to a whole GPU held), a MIG pool
# (no allocation; its GPU's instance holds counted), or a hold of one allocation (no
# pool count; a parent GPU only on a MIG instance's). A share added to a whole-GPU
# hold or to a MIG pool, or an instance's pool added to a whole-GPU hold or to a share
# pool, makes a row of none of them, and so does a pool past a whole GPU: the
# transaction is refused. A whole GPU and one of its instances are thus never held at
# once, whichever replica writes each.
HOLD_SHAPE = (
    f"(kind = '{SHARED}' AND allocation_id IS NULL AND share_milli IS NOT NULL"
    f" AND share_milli >= 0 AND share_milli <= {FULL_SHARE}"
    " AND instances IS NULL AND parent IS NULL)"
    f" OR (kind = '{MIG_POOL}' AND allocation_id IS NULL AND share_milli IS NULL"
    " AND instances IS NOT NULL AND instances >= 0 AND parent IS NULL)"
    f" OR (kind NOT IN ('{SHARED}', '{MIG_POOL}') AND allocation_id IS NOT NULL"
    " AND share_milli IS NULL AND instances IS NULL AND (kind = 'mig' OR parent IS NULL))"
)
SHARE_SHAPE = f"kind = 'shared' AND live = true AND milli > 0 AND milli <= {FULL_SHARE}"


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
    # When a caller last reused this live reservation (a retried bind, a gang member's
    # claim), stamped before the Binding that follows; NULL: never. A reconciler ends
    # only what was neither made nor reused since its cutoff (repository.quiet_since).
    sa.Column("touched_at", sa.DateTime(timezone=True), nullable=True),
    # True while live, NULL once ended: the target of the holds' foreign key.
    sa.Column("live", sa.Boolean(create_constraint=False), nullable=True),
    # One hold of this allocation while it is live (any one: the first written).
    sa.Column("anchor_node", sa.String(253), nullable=True),
    sa.Column("anchor_device", sa.String(128), nullable=True),
    # A share allocation's anchor instead: its row in gpu_shares.
    sa.Column("share_node", sa.String(253), nullable=True),
    sa.Column("share_device", sa.String(128), nullable=True),
    # The request's host figures per task (``cpu_milli``, ``memory_mib``), copied out of
    # ``request`` so that every sync sums them without reading the JSON; NULL: not asked.
    sa.Column("cpu_milli", sa.Integer, nullable=True),
    sa.Column("memory_mib", sa.Integer, nullable=True),
    sa.Index("ix_allocations_job_id", "job_id"),
    sa.Index("ix_allocations_state", "state"),
    sa.UniqueConstraint("id", "live", name="uq_allocations_id_live"),
    sa.CheckConstraint(ALLOCATIONS_LIVE, name="ck_allocations_live"),
    sa.CheckConstraint(
        "(state <> 'pending' OR expires_at IS NOT NULL)"
        " AND (state <> 'active' OR expires_at IS NULL)",
        name="ck_allocations_expiry",
    ),
    sa.ForeignKeyConstraint(
        ["anchor_node", "anchor_device", "id"],
        ["gpu_holds.node", "gpu_holds.device", "gpu_holds.allocation_id"],
        name="fk_allocations_anchor",
        deferrable=True,
        initially="DEFERRED",
        use_alter=True,  # the two tables name each other; this one is added after both
    ),
    sa.ForeignKeyConstraint(
        ["share_node", "share_device", "id"],
        ["gpu_shares.node", "gpu_shares.device", "gpu_shares.allocation_id"],
        name="fk_allocations_share_anchor",
        deferrable=True,
        initially="DEFERRED",
        use_alter=True,
    ),
)

gpu_holds = sa.Table(
    "gpu_holds",
    metadata,
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("device", sa.String(128), primary_key=True),  # GPU or MIG instance UUID
    # gpu | mig | cpu (device "cpu:N") | shared (a GPU's share pool) | migpool (a GPU
    # whose MIG instances are held: device is the GPU's UUID)
    sa.Column("kind", sa.String(8), nullable=False),
    # The holding allocation; NULL only for a share pool, which gpu_shares' rows hold.
    sa.Column("allocation_id", sa.String(36), nullable=True),
    # Always true: with allocation_id, it must name a live allocation.
    sa.Column(
        "live", sa.Boolean(create_constraint=False), nullable=False, server_default=sa.true()
    ),
    # A share pool's thousandths held, the sum of its shares; NULL on every other row.
    sa.Column("share_milli", sa.Integer, nullable=True),
    # A MIG pool's instance holds, counted; NULL on every other row.
    sa.Column("instances", sa.Integer, nullable=True),
    # A MIG instance's hold: the UUID of its GPU, whose pool counts it (NULL on every
    # other row).
    sa.Column("parent", sa.String(128), nullable=True),
    # The seq of the node's snapshot the reservation was chosen on, or a scheduler's truth
    # mapped on (NULL: none named, as a hold written before migration 0011). Its foreign
    # key to the node row makes a hold named on a snapshot a newer one replaced fail at
    # its commit;
    # a newer snapshot carries the holds already committed along (ON UPDATE CASCADE).
    sa.Column("node_seq", sa.BigInteger, nullable=True),
    # The reported_at of the node's snapshot chosen (a reservation) or mapped (a
    # scheduler's truth) on, and the node's cordon then: False for a reservation, as
    # memory had it for a truth (NULL: none named, a hold written before migration 0015).
    # Their foreign key to the node row makes a hold on a node cordoned (a reservation),
    # deleted and reported again, or whose cordon memory had wrong (a truth), since fail
    # at its commit; a report, cordon or uncordon carries the holds already committed
    # along (ON UPDATE CASCADE).
    sa.Column("node_reported_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("node_cordoned", sa.Boolean(create_constraint=False), nullable=True),
    sa.Index("ix_gpu_holds_allocation", "allocation_id"),
    # A snapshot report looks up whether another node's allocation holds its devices.
    sa.Index("ix_gpu_holds_device", "device"),
    sa.UniqueConstraint("node", "device", "allocation_id", name="uq_gpu_holds_node_device_alloc"),
    # What a share's foreign key names: a pool, never a whole-GPU hold.
    sa.UniqueConstraint("node", "device", "kind", name="uq_gpu_holds_node_device_kind"),
    sa.CheckConstraint("live = true", name="ck_gpu_holds_live"),
    sa.CheckConstraint(HOLD_SHAPE, name="ck_gpu_holds_shape"),
    sa.ForeignKeyConstraint(
        ["allocation_id", "live"],
        ["allocations.id", "allocations.live"],
        name="fk_gpu_holds_live_allocation",
        deferrable=True,
        initially="DEFERRED",
    ),
    sa.ForeignKeyConstraint(
        ["node", "node_seq"],
        ["nodes.name", "nodes.seq"],
        name="fk_gpu_holds_node_seq",
        onupdate="CASCADE",
        deferrable=True,
        initially="DEFERRED",
    ),
    sa.ForeignKeyConstraint(
        ["node", "node_reported_at", "node_cordoned"],
        ["nodes.name", "nodes.reported_at", "nodes.cordoned"],
        name="fk_gpu_holds_node_state",
        onupdate="CASCADE",
        deferrable=True,
        initially="DEFERRED",
    ),
)

# One row per share of a GPU (``gpu_fraction``): the allocation, and the thousandths it
# holds of the pool (node, device) it sits on. The same deferred key to a live
# allocation as a hold's; the key to the pool names kind 'shared', so a share can
# never sit on a GPU a whole-GPU allocation holds.
gpu_shares = sa.Table(
    "gpu_shares",
    metadata,
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("device", sa.String(128), primary_key=True),
    sa.Column("allocation_id", sa.String(36), primary_key=True),
    sa.Column("kind", sa.String(8), nullable=False, server_default="shared"),
    sa.Column("milli", sa.Integer, nullable=False),
    sa.Column(
        "live", sa.Boolean(create_constraint=False), nullable=False, server_default=sa.true()
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
    sa.Index("ix_gpu_shares_allocation", "allocation_id"),
    sa.Index("ix_gpu_shares_device", "device"),
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
    # The newest seq a snapshot signed by this key was taken with (NULL: none yet). It
    # outlives the node's row, so a deleted node's last snapshot sent again is a replay.
    sa.Column("seq", sa.BigInteger, nullable=True),
)

# Jobs whose end a scheduler's side said (a Slurm epilog releasing the job by id, the
# Slurm reconcile loop releasing a job it saw end), kept TOPOPLACE_ENDED_JOB_MEMORY_S: a
# report of the job's start processed after it (a late prolog) records nothing
# (docs/slurm.md, "A prolog report after the job ended").
ended_jobs = sa.Table(
    "ended_jobs",
    metadata,
    sa.Column("job_id", sa.String(256), primary_key=True),
    sa.Column("ended_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_ended_jobs_ended_at", "ended_at"),
)

# The newest List a node's device reports of one kubelet resource were taken from (the
# plugin's ``listed_at``, by the node's clock): a report whose List is older, by less
# than REORDER_S, changes nothing, on whichever replica it is answered. Checked and
# advanced in the transaction that takes the report (service/k8s/report_order.py).
k8s_report_order = sa.Table(
    "k8s_report_order",
    metadata,
    sa.Column("node", sa.String(253), primary_key=True),
    sa.Column("resource", sa.String(253), primary_key=True),
    sa.Column("listed_at", sa.DateTime(timezone=True), nullable=False),
)

# API tokens (service/tokens/): only the scrypt hash of each secret is kept. The
# scope is JSON ({"nodes": [...], "region": ...}) and empty for every role but agent
# and region.
api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("scope", sa.Text, nullable=False, server_default="{}"),
    sa.Column("name", sa.String(256), nullable=False, server_default=""),
    sa.Column("secret_hash", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(
        "role IN ('agent', 'region', 'scheduler', 'viewer', 'admin')", name="ck_api_tokens_role"
    ),
)

# Federation (service/federation/): the regions a global service routes to. Prices,
# egress and labels are JSON; ``summary`` is the latest signed summary the region
# pushed (its seq only grows). ``forward_token`` is the token the global service
# presents to the region's own service when it forwards a placement.
regions = sa.Table(
    "regions",
    metadata,
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

# Which region each Idempotency-Key went to: the same key retried goes there again,
# where the region's own service answers with the allocation it already made.
federation_forwards = sa.Table(
    "federation_forwards",
    metadata,
    sa.Column("idempotency_key", sa.String(256), primary_key=True),
    sa.Column("region", sa.String(63), nullable=False),
    sa.Column("gpu_model", sa.String(128), nullable=False),  # what the forward asked for
    # The request the key was sent for, as federation/forward_request.py writes it: the
    # key sent again for another request is refused. NULL: forwarded before it was kept (0016).
    sa.Column("request", sa.Text, nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    # The request forwarding it now, and until when (service/federation/store.py): a
    # twin request meanwhile is told the key is in flight. NULL: nobody holds it.
    sa.Column("holder", sa.String(32), nullable=True),
    sa.Column("held_until", sa.DateTime(timezone=True), nullable=True),
    # The oldest keys are forgotten past retention (service/federation/forward_retention.py).
    sa.Index("ix_federation_forwards_created_at", "created_at"),
)

# The audit log (service/audit/): one row per thing that happened, newest last. ``id``
# orders the rows and is the paging cursor. ``nodes`` holds every node the row
# concerns as ",a,b," so one LIKE finds a node among several (a gang spans nodes);
# ``detail`` is JSON and differs by kind (docs/security.md, "Audit log").
audit_log = sa.Table(
    "audit_log",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True),
    sa.Column("at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),  # allocation | admin | snapshot
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("actor_id", sa.String(64), nullable=True),  # the token's id; NULL: the service
    sa.Column("actor_name", sa.String(256), nullable=False, server_default=""),
    sa.Column("actor_role", sa.String(16), nullable=True),
    sa.Column("route", sa.String(128), nullable=False),  # "POST /v1/place", "gRPC Place", "sweep"
    sa.Column("nodes", sa.Text, nullable=False, server_default=""),
    sa.Column("job_id", sa.String(256), nullable=True),
    sa.Column("allocation_id", sa.String(36), nullable=True),
    sa.Column("detail", sa.Text, nullable=False, server_default="{}"),
    sa.Index("ix_audit_log_at", "at"),
    sa.Index("ix_audit_log_allocation_id", "allocation_id"),
    sa.Index("ix_audit_log_job_id", "job_id"),
    sa.Index("ix_audit_log_actor_id", "actor_id"),
)


def holdings() -> sa.Subquery:
    """Every (node, device, kind, allocation_id) an allocation holds: its holds (a share or
    MIG pool, which no allocation holds alone, left out) and its shares, kind ``shared``."""
    holds, shares = gpu_holds, gpu_shares
    return sa.union_all(
        sa.select(holds.c.node, holds.c.device, holds.c.kind, holds.c.allocation_id).where(
            holds.c.allocation_id.is_not(None)
        ),
        sa.select(shares.c.node, shares.c.device, shares.c.kind, shares.c.allocation_id),
    ).subquery("holdings")
