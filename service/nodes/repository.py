"""All SQL about nodes and their snapshot history."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service import schema


def get(conn: Connection, name: str) -> sa.RowMapping | None:
    return (
        conn.execute(sa.select(schema.nodes).where(schema.nodes.c.name == name)).mappings().first()
    )


def upsert_snapshot(
    conn: Connection,
    *,
    name: str,
    region: str,
    snapshot_json: str,
    seq: int,
    signature: str | None,
    now: datetime,
    exists: bool,
) -> None:
    values = {
        "region": region,
        "snapshot": snapshot_json,
        "seq": seq,
        "signature": signature,
        "reported_at": now,
        "heartbeat_at": now,
    }
    if exists:
        conn.execute(sa.update(schema.nodes).where(schema.nodes.c.name == name).values(**values))
    else:
        conn.execute(sa.insert(schema.nodes).values(name=name, cordoned=False, **values))


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


def touch_heartbeat(conn: Connection, name: str, now: datetime) -> bool:
    result = conn.execute(
        sa.update(schema.nodes).where(schema.nodes.c.name == name).values(heartbeat_at=now)
    )
    return bool(result.rowcount)


def set_cordoned(conn: Connection, name: str, cordoned: bool) -> bool:
    result = conn.execute(
        sa.update(schema.nodes).where(schema.nodes.c.name == name).values(cordoned=cordoned)
    )
    return bool(result.rowcount)


def delete(conn: Connection, name: str) -> bool:
    result = conn.execute(sa.delete(schema.nodes).where(schema.nodes.c.name == name))
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


def delete_key(conn: Connection, name: str) -> bool:
    table = schema.node_keys
    return bool(conn.execute(sa.delete(table).where(table.c.node == name)).rowcount)
