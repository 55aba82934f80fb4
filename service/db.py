"""Database engine: one per process, SQLite tuned for a single embedded service."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine


def make_engine(database_url: str) -> Engine:
    if database_url.startswith("sqlite"):
        engine = sa.create_engine(
            database_url, connect_args={"check_same_thread": False, "timeout": 30}
        )

        @sa.event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            # Foreign keys are off by default in SQLite; WAL lets readers run during a write.
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return engine
    # No pre-ping: it costs a round trip per request on the /place path; a
    # connection that died is recycled on its error and the request answers 503.
    return sa.create_engine(database_url, pool_size=10, max_overflow=10, pool_recycle=1800)
