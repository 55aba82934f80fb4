"""Applying the Alembic migrations programmatically (``topoplace db upgrade``, ``serve``)."""

from __future__ import annotations

from importlib.resources import files

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(files("migrations")))
    # ConfigParser interpolation would eat a '%' in a password.
    config.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def current_head() -> str:
    head = _scripts().get_current_head()
    return head or ""


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def database_revisions(database_url: str) -> tuple[str, ...]:
    """The revisions stamped in the database (none: no schema yet)."""
    engine = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_heads()
    finally:
        engine.dispose()


def schema_mismatch(database_url: str) -> str | None:
    """None when the database's schema is the one this code needs; otherwise one line
    saying the revision it is at, the one needed, and what to run. For a service that
    does not migrate on start: on an older schema its queries fail on the first missing
    column, on a newer one its writes may break a rule the code does not know."""
    needed = current_head()
    found = database_revisions(database_url)
    if found == (needed,):
        return None
    if not found:
        return (
            f"the database has no schema yet and this code needs revision {needed}:"
            " run `topoplace db upgrade`, or let serve migrate (drop --no-migrate,"
            " TOPOPLACE_MIGRATE_ON_START=false)"
        )
    at = ", ".join(found)
    known = all(_known(revision) for revision in found)
    if known:
        return (
            f"the database's schema is at revision {at} and this code needs {needed}:"
            " run `topoplace db upgrade`, or let serve migrate (drop --no-migrate,"
            " TOPOPLACE_MIGRATE_ON_START=false)"
        )
    return (
        f"the database's schema is at revision {at}, which this code does not know (a"
        f" newer topoplace migrated it), and this code needs {needed}: run the topoplace"
        " that migrated it, or a newer one"
    )


def _known(revision: str) -> bool:
    try:
        return _scripts().get_revision(revision) is not None
    except CommandError:  # no such revision among this code's migrations
        return False
