"""A reservation written at once (the Slurm filter's): on SQLite only, never waiting on a lock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from service import migrate
from service.allocations.group_commit import GroupCommitter
from tests.service.allocations.test_group_commit import _holders, _row
from tests.service.allocations.test_group_commit import engine as engine  # the fixture


def _commit(committer: GroupCommitter, device: str) -> None:
    asyncio.run(committer.commit_async(_row(device), [("n0", device, "gpu")], ["n0"], at_once=True))


def test_alone_the_reservation_is_written_at_once_on_sqlite_only(engine: sa.Engine) -> None:
    committer = GroupCommitter(engine)
    try:
        _commit(committer, "g0")
        assert _holders(engine) == ["g0"]
        sqlite = engine.dialect.name == "sqlite"
        assert committer.at_once == (1 if sqlite else 0)
        assert (committer._thread is None) is sqlite  # no hand-over to its thread
    finally:
        committer.stop()


def test_a_gpu_held_twice_is_refused_when_written_at_once_too(engine: sa.Engine) -> None:
    committer = GroupCommitter(engine)
    try:
        _commit(committer, "g0")
        with pytest.raises(IntegrityError):
            _commit(committer, "g0")
        _commit(committer, "g1")  # the connection kept for it still writes
        assert _holders(engine) == ["g0", "g1"]
    finally:
        committer.stop()


def test_a_database_another_writer_holds_sends_the_reservation_to_the_queue(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/held.sqlite3"
    migrate.upgrade(url)
    engine = sa.create_engine(url, connect_args={"timeout": 30})
    committer = GroupCommitter(engine)
    other = engine.raw_connection()
    try:
        cursor = other.cursor()
        cursor.execute("BEGIN IMMEDIATE")  # another writer holds the database

        async def scenario() -> None:
            write = asyncio.ensure_future(
                committer.commit_async(_row("g0"), [("n0", "g0", "gpu")], ["n0"], at_once=True)
            )
            await asyncio.sleep(0.2)
            assert not write.done()  # waiting in the queue, not refused, loop not blocked
            other.rollback()
            await asyncio.wait_for(write, 10)

        asyncio.run(scenario())
        assert committer.at_once == 0 and committer.committed == 1
        assert _holders(engine) == ["g0"]
    finally:
        other.close()
        committer.stop()


def test_a_worker_threads_commit_is_written_at_once_too(engine: sa.Engine) -> None:
    committer = GroupCommitter(engine)
    try:
        committer.commit(_row("g0"), [("n0", "g0", "gpu")], ["n0"], at_once=True)
        with pytest.raises(IntegrityError):
            committer.commit(_row("g0"), [("n0", "g0", "gpu")], ["n0"], at_once=True)
        committer.commit(_row("g1"), [("n0", "g1", "gpu")], ["n0"])  # the queue, as before
        assert _holders(engine) == ["g0", "g1"]
        assert committer.at_once == 1  # Postgres too: a worker thread may wait on it
        assert committer.committed == 2
    finally:
        committer.stop()


def test_a_kept_connection_the_server_dropped_sends_the_write_to_the_queue(
    engine: sa.Engine,
) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("a server that ends a connection: Postgres")
    committer = GroupCommitter(engine)
    try:
        committer.commit(_row("g0"), [("n0", "g0", "gpu")], ["n0"], at_once=True)
        kept = committer.writer._kept
        pid = kept.cursor().connection.info.backend_pid if kept is not None else None
        assert pid is not None
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            conn.commit()
        committer.commit(_row("g1"), [("n0", "g1", "gpu")], ["n0"], at_once=True)
        assert _holders(engine) == ["g0", "g1"]
        assert committer.at_once == 1 and committer.committed == 2  # g1 through the queue
        committer.commit(_row("g2"), [("n0", "g2", "gpu")], ["n0"], at_once=True)
        assert committer.at_once == 2  # and the next write at once on a new connection
    finally:
        committer.stop()


def test_a_write_at_once_that_meets_a_deadlock_is_run_again_not_refused(
    engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Postgres aborts one of two transactions that wait on each other (a bind's write
    and a cordon's cascade to the node's holds, docs: set_cordoned): the queue's writes
    run it again unheard. Was: the write at once (the Kubernetes bind) raised it, and
    the bind answered 503 database_unavailable for a database that was up."""
    if engine.dialect.name != "postgresql":
        pytest.skip("deadlock detection: Postgres")
    import psycopg.errors

    committer = GroupCommitter(engine)
    write_now = committer.writer.write_now
    calls: list[int] = []

    def deadlocked_once(*args: Any, **kwargs: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            orig = psycopg.errors.DeadlockDetected("deadlock detected")
            raise sa.exc.DBAPIError.instance("INSERT", {}, orig, psycopg.Error)
        write_now(*args, **kwargs)

    monkeypatch.setattr(committer.writer, "write_now", deadlocked_once)
    try:
        committer.commit(_row("g0"), [("n0", "g0", "gpu")], ["n0"], at_once=True)
        assert _holders(engine) == ["g0"]
        assert committer.committed == 1
    finally:
        committer.stop()
