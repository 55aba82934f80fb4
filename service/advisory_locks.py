"""Postgres advisory locks on names (device UUIDs, job ids), a bounded number per transaction.

Every advisory lock held takes a slot of Postgres's shared lock table, which the
whole server shares (max_locks_per_transaction x max_connections, 6,400 slots by
default). A lock per name let one report naming 4,095 MIG UUIDs fill it: other
reports answered 503 "out of shared memory" and pg_dump failed. So names are
hashed into ``BUCKETS`` keys, and a transaction holds at most that many locks per
namespace whatever it names. Two transactions naming one name still take one key
and run one after the other; two naming different names of one bucket wait on
each other needlessly, which costs a short wait, never a wrong answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

BUCKETS = 64


def hold(conn: Connection, namespace: int, names: Iterable[str]) -> None:
    """Postgres: hold, until the transaction ends, the locks of these names' buckets in
    ``namespace`` (the first key of pg_advisory_xact_lock's pair). Taken in key order,
    so transactions never deadlock on each other. Other databases: nothing."""
    if conn.dialect.name != "postgresql":
        return
    keys = sorted({bucket(name) for name in names})
    if keys:
        conn.execute(
            sa.text(
                "SELECT count(pg_advisory_xact_lock(:ns, k))"
                " FROM (SELECT unnest(CAST(:keys AS integer[])) AS k ORDER BY 1) AS sorted_keys"
            ),
            {"ns": namespace, "keys": keys},
        )


def bucket(name: str) -> int:
    digest = hashlib.blake2b(name.encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") % BUCKETS
