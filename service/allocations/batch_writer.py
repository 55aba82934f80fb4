"""A batch of reservations written through the database driver, with statements
compiled once per engine.

The group committer is the one writer of reservations, and its statements
never change: an insert into ``allocations``, one into ``gpu_holds``, one into
``audit_log`` (each decision's row) and, on Postgres, a notification. Through
SQLAlchemy each execute looked up its compiled form and built an execution
context and a result: on SQLite that was 0.07 ms of a 0.11 ms reservation, and
0.40 of 0.54 ms right after an idle moment, when the CPU caches hold other
programs' work (the Slurm filter's case: the service idles between two sbatch
submissions). The driver's cursor does the same writes in 0.04 ms, 0.14 ms
after idle.

SQLAlchemy still compiles the statements for the engine's dialect and
converts each value with the column type's own bind processor, so what is
stored is what the rest of the service reads back through it. Errors come
out as SQLAlchemy's (IntegrityError, OperationalError), and a connection the
driver reports lost is invalidated, as SQLAlchemy would do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.pool import Pool, QueuePool

from service import schema
from service.allocations import pools
from service.notify import CHANNEL, message

Params = list[tuple[Any, ...]] | list[dict[str, Any]]
_IDLE = 0  # libpq's PQTRANS_IDLE: no transaction open on the connection


class _Statement:
    """A statement over ``written`` columns, with the dialect's placeholders and each
    column type's bind processor."""

    def __init__(
        self, statement: sa.Insert, written: Sequence[sa.Column[Any]], dialect: Dialect
    ) -> None:
        compiled = statement.compile(dialect=dialect)
        self.sql = str(compiled)
        self.positional = bool(dialect.positional)
        self.columns: list[tuple[str, Callable[[Any], Any] | None]] = [
            (column.key, column.type.dialect_impl(dialect).bind_processor(dialect))
            for column in written
        ]
        if self.positional and list(compiled.positiontup or ()) != [n for n, _ in self.columns]:
            raise RuntimeError(f"unexpected parameter order in {self.sql!r}")

    def params(self, rows: Sequence[Mapping[str, Any]]) -> Params:
        """Each row's values in the statement's order; a column a row lacks is NULL (a
        whole-GPU reservation names no share anchor, a hold no pool count)."""
        columns = self.columns
        if self.positional:
            return [
                tuple(row.get(n) if c is None else c(row.get(n)) for n, c in columns)
                for row in rows
            ]
        return [{n: row.get(n) if c is None else c(row.get(n)) for n, c in columns} for row in rows]


def _insert(table: sa.Table, dialect: Dialect, skip: tuple[str, ...] = ()) -> _Statement:
    """``INSERT INTO table`` of every column but ``skip`` (a key the database numbers)."""
    written = [column for column in table.columns if column.key not in skip]
    statement = sa.insert(table).values({c.key: sa.bindparam(c.key) for c in written})
    return _Statement(statement, written, dialect)


def _pool_add(dialect: Dialect, kind: str) -> _Statement:
    """Added to a pool of ``kind`` (pools.upsert): a share to its GPU's share pool, or a
    MIG instance's hold to its GPU's MIG pool (docs/service.md, "GPU shares in the
    database", "MIG instances in the database")."""
    statement, written = pools.upsert(dialect, kind)
    return _Statement(statement, written, dialect)


class BatchWriter:
    """Writes the group committer's batches; safe to share between threads."""

    def __init__(self, engine: Engine, *, own_pool: bool = False) -> None:
        """``own_pool``: ``write`` takes its connection from a pool of its own, not the
        engine's (the group committer, one thread: one connection; see ``_batch_pool``)."""
        self.engine = engine
        self._own_pool = own_pool
        self._pool: Pool | None = None if own_pool else engine.pool  # made at the first batch
        dialect = engine.dialect
        self.dialect = dialect
        self.allocations = _insert(schema.allocations, dialect)
        self.holds = _insert(schema.gpu_holds, dialect)
        self.pools = _pool_add(dialect, pools.SHARED)
        self.mig_pools = _pool_add(dialect, pools.MIG_POOL)
        self.shares = _insert(schema.gpu_shares, dialect)
        self.audit = _insert(schema.audit_log, dialect, skip=("id",))
        self.notify: str | None = None
        self._kept: Any = None  # write_now's own connection, kept between writes
        if dialect.name == "postgresql":
            notify = sa.select(sa.func.pg_notify(sa.bindparam("channel"), sa.bindparam("body")))
            self.notify = str(notify.compile(dialect=dialect))

    def write(
        self,
        rows: Sequence[Mapping[str, Any]],
        holds: Sequence[Mapping[str, Any]],
        nodes: Sequence[str],
        audits: Sequence[Mapping[str, Any]] = (),
        shares: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Insert the rows, holds, shares and audit rows and announce the nodes, in one
        transaction. A share is (node, device, allocation_id, milli), and a hold or share
        may name ``node_seq``, the node snapshot it was chosen on, ``node_reported_at`` and
        ``node_cordoned`` (service/schema.py)."""
        steps = self._steps(rows, holds, nodes, audits, shares)
        dbapi_error: type[Exception] = self.dialect.loaded_dbapi.Error
        if self._pool is None:
            # Made here, not at the start: it copies the engine's pool events as they are
            # now (a test's watch on every checkout, added once the service runs).
            self._pool = _batch_pool(self.engine)
        try:
            connection = self._pool.connect()
        except dbapi_error as exc:  # no server: what Engine.connect would raise
            error = sa.exc.DBAPIError.instance(None, None, exc, dbapi_error, dialect=self.dialect)
            raise error from exc
        try:
            self._run(connection, steps)
        finally:
            connection.close()

    def write_now(
        self,
        rows: Sequence[Mapping[str, Any]],
        holds: Sequence[Mapping[str, Any]],
        nodes: Sequence[str],
        audits: Sequence[Mapping[str, Any]] = (),
        shares: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """``write`` through a connection kept for it (no pool checkout and return, 0.04
        ms after idle). On SQLite it never waits for another writer: a database held by
        one raises SQLite's 'database is locked' at once, and nothing is written. For one
        caller at a time (the group committer's writes at once)."""
        steps = self._steps(rows, holds, nodes, audits, shares)
        if self._kept is None:
            connection = self.engine.raw_connection()
            # Out of the pool for good: its no-wait setting must never reach another user.
            connection.detach()
            if self.dialect.name == "sqlite":
                cursor = connection.cursor()
                cursor.execute("PRAGMA busy_timeout=0")
                cursor.close()
            self._kept = connection
        try:
            self._run(self._kept, steps)
        except sa.exc.DBAPIError as exc:
            if exc.connection_invalidated:
                self._kept = None
            raise

    def landed(self, ids: Sequence[str]) -> bool:
        """Whether every one of these allocations is stored, read on a connection of its
        own. A connection lost at the commit leaves its outcome unknown: the server may
        have committed and its answer been lost on the way. Raises what the read meets."""
        column = schema.allocations.c.id
        with self.engine.connect() as conn:
            found = conn.execute(sa.select(sa.func.count()).where(column.in_(list(ids))))
            return int(found.scalar_one()) == len(set(ids))

    def close(self) -> None:
        """Close write_now's kept connection and the batches' own pool (the committer
        stops)."""
        if self._kept is not None:
            _quietly(self._kept.close)
            self._kept = None
        if self._own_pool and self._pool is not None and self._pool is not self.engine.pool:
            self._pool.dispose()
            self._pool = None

    def _steps(
        self,
        rows: Sequence[Mapping[str, Any]],
        holds: Sequence[Mapping[str, Any]],
        nodes: Sequence[str],
        audits: Sequence[Mapping[str, Any]],
        shares: Sequence[Mapping[str, Any]],
    ) -> list[tuple[str, Params]]:
        steps: list[tuple[str, Params]] = [(self.allocations.sql, self.allocations.params(rows))]
        if holds:
            steps.append((self.holds.sql, self.holds.params(holds)))
            if counted := pools.mig_pools(holds):
                steps.append((self.mig_pools.sql, self.mig_pools.params(counted)))
        if shares:
            share_pools = [
                {
                    "node": s["node"],
                    "device": s["device"],
                    "kind": "shared",
                    "live": True,
                    "share_milli": s["milli"],
                    "node_seq": s.get("node_seq"),
                    "node_reported_at": s.get("node_reported_at"),
                    "node_cordoned": s.get("node_cordoned"),
                }
                for s in shares
            ]
            steps.append((self.pools.sql, self.pools.params(share_pools)))
            rows_of_shares = [{**s, "kind": "shared", "live": True} for s in shares]
            steps.append((self.shares.sql, self.shares.params(rows_of_shares)))
        if audits:
            steps.append((self.audit.sql, self.audit.params(audits)))
        if self.notify is not None and (body := message(nodes)) is not None:
            steps.append((self.notify, [{"channel": CHANNEL, "body": body}]))
        return steps

    def _run(self, connection: Any, steps: list[tuple[str, Params]]) -> None:
        """The steps in one transaction, committed; rolled back on an error."""
        dbapi_error: type[Exception] = self.dialect.loaded_dbapi.Error
        cursor = connection.cursor()
        statement, params = steps[0]  # named by the error if the first step fails
        try:
            if self.dialect.name == "postgresql":
                _pipelined(connection, cursor, steps)
            else:
                for statement, params in steps:
                    _execute(cursor, statement, params)
                connection.commit()
        except dbapi_error as exc:
            raise self._failed(connection, cursor, exc, statement, params) from exc
        finally:
            _quietly(cursor.close)

    def _failed(
        self,
        connection: Any,
        cursor: Any,
        exc: Exception,
        statement: str,
        params: Params,
    ) -> sa.exc.StatementError:
        lost = self.dialect.is_disconnect(cast(Any, exc), connection.dbapi_connection, cursor)
        if lost:
            connection.invalidate(exc)
        else:
            _quietly(connection.rollback)
        return sa.exc.DBAPIError.instance(
            statement,
            params,
            exc,
            self.dialect.loaded_dbapi.Error,
            connection_invalidated=lost,
            dialect=self.dialect,
        )


def _batch_pool(engine: Engine) -> Pool:
    """A pool for the group committer's batches alone, with the engine's connection
    settings and events. In the engine's pool a batch waited behind every request that
    reads: 40 listings in flight (FastAPI's 40 worker threads) held its 20 connections
    and queued for them, and each /place's commit queued behind them (p50 0.79 s, max
    2.5 s, against 0.10 s and 0.26 s in a pool of its own), past the pool's 30 s wait
    a 500. The committer is one thread, so this pool holds one connection. An
    engine whose pool is not a queue (SQLite in memory: one connection, shared) keeps
    its own."""
    if not isinstance(engine.pool, QueuePool):
        return engine.pool
    return engine.pool.recreate()


def _execute(cursor: Any, statement: str, params: Params) -> None:
    if len(params) == 1:
        cursor.execute(statement, params[0])
    else:
        cursor.executemany(statement, params)


def _pipelined(connection: Any, cursor: Any, steps: list[tuple[str, Params]]) -> None:
    """Postgres: BEGIN, the steps and COMMIT in one psycopg pipeline with one Sync at its
    end, so the batch waits for the server once. Left to psycopg, the transaction's
    BEGIN and COMMIT would each wait for a Sync of their own (a bare three-statement
    batch on loopback: 0.50 against 0.28 ms; a reservation in the service: 1.00 against
    0.92 ms), so the connection is in autocommit mode for the batch and the two are
    sent as statements. A statement that fails (a GPU held twice) makes the
    server skip the rest up to the Sync, COMMIT included, and the transaction is rolled
    back here; a deferred check that fails at the COMMIT ends it rolled back already.
    Either way the error is raised when the pipeline ends, with nothing written. (Without
    the BEGIN the server would run the batch as one implicit transaction, but psycopg
    cannot leave a pipeline whose Sync itself failed: the deferred foreign keys.)"""
    dbapi = connection.dbapi_connection
    was = dbapi.autocommit
    dbapi.autocommit = True
    try:
        with dbapi.pipeline():
            cursor.execute("BEGIN")
            for statement, params in steps:
                _execute(cursor, statement, params)
            cursor.execute("COMMIT")
    except Exception:
        if not dbapi.closed and dbapi.info.transaction_status != _IDLE:
            # psycopg's rollback, not a ROLLBACK statement: it also forgets the statements
            # it meant to prepare in this pipeline, whose Parse the server skipped after
            # the error (else their next use finds no such statement).
            _quietly(dbapi.rollback)
        raise
    finally:
        if not dbapi.closed and dbapi.info.transaction_status == _IDLE:
            dbapi.autocommit = was  # a pooled connection goes back as it came


def _quietly(action: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # the connection is being given up anyway
        action()
