"""Alembic environment: the URL comes from the caller or TOPOPLACE_DATABASE_URL."""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import Engine, create_engine, event, pool
from sqlalchemy.engine import Connection

from service import advisory_locks
from service.db import postgres_connect_args
from service.schema import metadata
from service.settings import Settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or Settings().database_url
target_metadata = metadata
# Advisory lock namespace (the first key of pg_advisory_xact_lock's pair) for upgrades.
UPGRADE_LOCKS = 0x746D  # "tm"


def run_offline() -> None:
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        context.configure(connection=connectable, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    sqlite = url.startswith("sqlite")
    # The service's connection limits on Postgres: a database that never answers fails
    # the upgrade (and `serve`) within connect_timeout instead of holding it silent.
    engine = (
        _sqlite_engine(url)
        if sqlite
        else create_engine(url, poolclass=pool.NullPool, connect_args=postgres_connect_args(url))
    )
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=sqlite,
            # Every pending migration in one transaction, SQLite's too (Alembic would
            # commit after each there): an upgrade killed half-way leaves the old schema
            # whole, and the next one starts from it.
            transactional_ddl=True,
        )
        with context.begin_transaction():
            # Replicas starting together on one Postgres all upgrade: each created the
            # same tables, and all but the first failed on them ("relation already
            # exists"). The lock, held to the commit, makes the others wait; each then
            # reads the revision the first stamped and finds nothing to do. (SQLite:
            # nothing here, BEGIN IMMEDIATE does it.)
            advisory_locks.hold(connection, UPGRADE_LOCKS, ["schema"])
            context.run_migrations()


def _sqlite_engine(url: str) -> Engine:
    """An SQLite engine whose transactions hold DDL too. pysqlite opens a transaction
    only before INSERT, UPDATE or DELETE, so every CREATE, DROP and ALTER was committed
    as it ran: an upgrade killed between two statements left tables of a later revision
    than the one stamped, and the next upgrade failed on them. So the driver's own
    transactions are turned off and the BEGIN is emitted here (SQLAlchemy's documented
    recipe, "Serializable isolation / Savepoints / Transactional DDL"). IMMEDIATE takes
    the write lock at once: a second upgrade starting meanwhile waits for this one
    (up to the timeout), then reads its revision and finds nothing to do."""
    engine = create_engine(url, poolclass=pool.NullPool, connect_args={"timeout": 60})

    @event.listens_for(engine, "connect")
    def _no_driver_transactions(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


if context.is_offline_mode():
    run_offline()
else:
    run_online()
