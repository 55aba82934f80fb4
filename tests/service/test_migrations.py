"""The migrated database is exactly the schema the code uses."""

from __future__ import annotations

import sqlalchemy as sa

from service import migrate, schema


def test_upgrade_head_creates_the_schema(database_url: str) -> None:
    migrate.upgrade(database_url)
    migrate.upgrade(database_url)  # idempotent
    engine = sa.create_engine(database_url)
    inspector = sa.inspect(engine)
    for table in schema.metadata.sorted_tables:
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name for c in table.columns}, table.name
    keys = inspector.get_pk_constraint("gpu_holds")["constrained_columns"]
    assert keys == ["node", "device"]
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
    engine.dispose()
    assert version == migrate.current_head()
