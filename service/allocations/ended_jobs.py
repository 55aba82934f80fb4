"""All SQL about the jobs whose end was said (``ended_jobs``, service/schema.py).

A job's end (its release by job id, a Slurm epilog's; the Slurm reconcile loop
releasing a job it saw end) and a report of its start (a Slurm prolog's) are
made one after the other for one job id, on any replica: each transaction first
takes ``lock``, and only then reads what the other wrote. On Postgres that is an
advisory lock on the job id's bucket (service/advisory_locks.py); on SQLite,
``forget_old``'s delete, a write, takes the database's one write lock before the
transaction reads anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection

from service import advisory_locks, schema

_T = schema.ended_jobs
# Advisory lock namespace (the first key of pg_advisory_xact_lock's pair) for job ids.
_JOB_LOCKS = 0x746A  # "tj"


def lock(conn: Connection, job_ids: Iterable[str], forget_before: datetime) -> None:
    """Hold these jobs until the transaction ends, and forget the ends said before
    ``forget_before`` (past the memory's window). Taken first in the transaction."""
    advisory_locks.hold(conn, _JOB_LOCKS, job_ids)  # 64 locks at most, in one order
    # On SQLite this write starts the transaction's hold of the write lock.
    conn.execute(sa.delete(_T).where(_T.c.ended_at < forget_before))


def remember(conn: Connection, job_ids: Iterable[str], now: datetime) -> None:
    """These jobs ended now (a job said ended again keeps the later time)."""
    rows = [{"job_id": job_id, "ended_at": now} for job_id in sorted(set(job_ids))]
    if not rows:
        return
    dialect_insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
    insert = dialect_insert(_T)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=[_T.c.job_id], set_={"ended_at": insert.excluded.ended_at}
        ),
        rows,
    )


def ended_since(conn: Connection, job_id: str, since: datetime) -> bool:
    """Whether the job's end was said at ``since`` or later."""
    query = sa.select(_T.c.job_id).where(_T.c.job_id == job_id, _T.c.ended_at >= since)
    return conn.execute(query).first() is not None


def said_at(conn: Connection, job_id: str, at: datetime) -> bool:
    """Whether the job's end was remembered at exactly ``at``: a transaction that said it
    then and whose commit went unanswered finds here that it committed (``at`` is its
    own moment, to the microsecond)."""
    query = sa.select(_T.c.job_id).where(_T.c.job_id == job_id, _T.c.ended_at == at)
    return conn.execute(query).first() is not None
