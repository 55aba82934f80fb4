"""Alembic environment: the URL comes from the caller or TOPOPLACE_DATABASE_URL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from service.db import postgres_connect_args
from service.schema import metadata
from service.settings import Settings

config = context.config
url = config.get_main_option("sqlalchemy.url") or Settings().database_url
target_metadata = metadata


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
    # The service's connection limits: a database that never answers fails the
    # upgrade (and `serve`) within connect_timeout instead of holding it silent.
    engine = engine_from_config(
        {"sqlalchemy.url": url},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
        connect_args={} if url.startswith("sqlite") else postgres_connect_args(url),
    )
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=url.startswith("sqlite"),
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
