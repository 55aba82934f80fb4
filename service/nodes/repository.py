"""All SQL about nodes and their snapshot history."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service import advisory_locks, schema


def get(conn: Connection, name: str, *, hold: bool = False) -> sa.RowMapping | None:
    """The node's row; ``hold``: share-locked until the transaction ends (Postgres; SQLite's
    writes are one at a time anyway), so no other transaction changes it meanwhile."""
    query = sa.select(schema.nodes).where(schema.nodes.c.name == name)
    if hold:
        query = query.with_for_update(read=True)
    return conn.execute(query).mappings().first()


@dataclass(frozen=True)
class StoredSnapshot:
    """A node row's snapshot columns, as a report writes them."""

    name: str
    region: str
    body: str  # the NodeSnapshot JSON
    seq: int
    signature: str | None

    def values(self, now: datetime) -> dict[str, object]:
        return {
            "region": self.region,
            "snapshot": self.body,
            "seq": self.seq,
            "signature": self.signature,
            "reported_at": now,
            "heartbeat_at": now,
        }


def insert_snapshot(conn: Connection, snap: StoredSnapshot, now: datetime) -> None:
    """A node's first snapshot; IntegrityError when another first one was inserted meanwhile."""
    conn.execute(sa.insert(schema.nodes).values(name=snap.name, cordoned=False, **snap.values(now)))


def update_snapshot(
    conn: Connection,
    snap: StoredSnapshot,
    now: datetime,
    *,
    same_again: bool = True,
    region: str | None = None,
) -> bool:
    """Store a newer snapshot, or (``same_again``) the same one again; False when the stored
    one is newer (or, without ``same_again``, not older), or (``region``) the node is no
    longer stored in that region.

    The seq rule is the statement's condition, not a read before it: of two
    reports racing, the older can never overwrite the newer. So is the region, for a
    caller allowed only there: a move to another region that committed first wins.
    """
    nodes = schema.nodes
    not_older = nodes.c.seq < snap.seq
    if same_again:
        not_older = sa.or_(
            not_older, sa.and_(nodes.c.seq == snap.seq, nodes.c.snapshot == snap.body)
        )
    where = [nodes.c.name == snap.name, not_older]
    if region is not None:
        where.append(nodes.c.region == region)
    result = conn.execute(sa.update(nodes).where(*where).values(**snap.values(now)))
    return bool(result.rowcount)


# Advisory lock namespace (the first key of pg_advisory_xact_lock's pair) for device UUIDs.
_UUID_LOCKS = 0x7470  # "tp"


def lock_device_uuids(conn: Connection, uuids: Iterable[str]) -> None:
    """Postgres: hold, until the transaction ends, the locks of these device UUIDs (64 at
    most, service/advisory_locks.py), so that two replicas storing snapshots that name
    one UUID check ownership one after the other.

    SQLite needs none: its writers are serialized, and the check runs after this
    transaction's first write.
    """
    advisory_locks.hold(conn, _UUID_LOCKS, uuids)


# A stored snapshot's (seq, reported_at): together they name one content (a seq alone
# does not: a deleted node may be reported again under its old seq).
Stored = tuple[int, datetime | None]


def stored_seqs(conn: Connection) -> dict[str, Stored]:
    """Every stored node's (seq, reported_at): says which snapshots a process already
    has in memory."""
    nodes = schema.nodes
    query = sa.select(nodes.c.name, nodes.c.seq, nodes.c.reported_at)
    return {str(name): (int(seq), _aware(at)) for name, seq, at in conn.execute(query)}


def _aware(value: datetime) -> datetime:
    # SQLite hands back naive datetimes for timezone-aware columns.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def snapshot_bodies(conn: Connection, names: list[str]) -> Iterator[tuple[str, str]]:
    nodes = schema.nodes
    for start in range(0, len(names), _NAMES_PER_QUERY):
        chunk = names[start : start + _NAMES_PER_QUERY]
        query = sa.select(nodes.c.name, nodes.c.snapshot).where(nodes.c.name.in_(chunk))
        for name, body in conn.execute(query):
            yield str(name), str(body)


_NAMES_PER_QUERY = 500


def add_history(
    conn: Connection,
    *,
    name: str,
    snapshot_json: str,
    seq: int,
    signature: str | None,
    now: datetime,
    keep: int,
) -> None:
    history = schema.node_snapshots
    conn.execute(
        sa.insert(history).values(
            node=name, seq=seq, snapshot=snapshot_json, signature=signature, received_at=now
        )
    )
    # Bounded history: keep the newest `keep` rows of this node.
    newest = (
        sa.select(history.c.id)
        .where(history.c.node == name)
        .order_by(history.c.id.desc())
        .limit(keep)
        .scalar_subquery()
    )
    conn.execute(sa.delete(history).where(history.c.node == name, history.c.id.not_in(newest)))


def touch_heartbeat(
    conn: Connection, name: str, now: datetime, *, region: str | None = None
) -> bool:
    """Stamp the node alive; False when it is not stored (or, with ``region``, not stored
    in that region: the condition is the statement's, so a move committed first wins)."""
    where = [schema.nodes.c.name == name]
    if region is not None:
        where.append(schema.nodes.c.region == region)
    result = conn.execute(sa.update(schema.nodes).where(*where).values(heartbeat_at=now))
    return bool(result.rowcount)


def set_cordoned(conn: Connection, name: str, cordoned: bool) -> bool | None:
    """True: the node's cordon changed; False: it was so already (nothing written); None:
    no such node. A call racing another that sets the same value waits on the row and then
    finds it so (Postgres re-reads the row it waited on), so only one of them changes it."""
    nodes = schema.nodes
    result = conn.execute(
        sa.update(nodes)
        .where(nodes.c.name == name, nodes.c.cordoned.is_not(cordoned))
        .values(cordoned=cordoned)
    )
    if result.rowcount:
        return True
    found = conn.execute(sa.select(nodes.c.name).where(nodes.c.name == name)).first()
    return None if found is None else False


def delete(conn: Connection, name: str) -> bool:
    result = conn.execute(sa.delete(schema.nodes).where(schema.nodes.c.name == name))
    # The order of its device reports goes with it: a machine registered again under the
    # name, its clock behind the old one's, would have its reports deferred on it.
    order = schema.k8s_report_order
    conn.execute(sa.delete(order).where(order.c.node == name))
    return bool(result.rowcount)


def history(conn: Connection, name: str) -> list[sa.RowMapping]:
    table = schema.node_snapshots
    query = sa.select(table).where(table.c.node == name).order_by(table.c.id.desc())
    return list(conn.execute(query).mappings().all())


def get_key(conn: Connection, name: str) -> sa.RowMapping | None:
    table = schema.node_keys
    return conn.execute(sa.select(table).where(table.c.node == name)).mappings().first()


def insert_key(
    conn: Connection, *, name: str, algorithm: str, public_key: str, now: datetime
) -> None:
    conn.execute(
        sa.insert(schema.node_keys).values(
            node=name, algorithm=algorithm, public_key=public_key, registered_at=now
        )
    )


def mark_signed_seq(conn: Connection, name: str, seq: int) -> None:
    """Remember ``seq`` as the newest taken under the node's key (it only grows)."""
    table = schema.node_keys
    conn.execute(
        sa.update(table)
        .where(table.c.node == name, sa.or_(table.c.seq.is_(None), table.c.seq < seq))
        .values(seq=seq)
    )


def delete_key(conn: Connection, name: str) -> bool:
    table = schema.node_keys
    return bool(conn.execute(sa.delete(table).where(table.c.node == name)).rowcount)
