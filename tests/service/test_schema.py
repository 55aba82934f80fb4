"""The database itself refuses what would break the one promise, whatever code runs.

Each statement here is what a transition without its guard would write; on
the schema before the live/anchor constraints every one of them committed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from service import migrate, schema
from service.db import make_engine

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
# What ending an allocation writes to its row (repository.end).
ENDED = {
    "state": "released",
    "live": None,
    "anchor_node": None,
    "anchor_device": None,
    "ended_at": NOW,
    "expires_at": None,
}


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)  # SQLite: with foreign keys on, as the service runs
    yield engine
    engine.dispose()


def _live(engine: sa.Engine, state: str = "pending", device: str = "GPU-a") -> str:
    allocation = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(
            sa.insert(schema.allocations).values(
                id=allocation,
                state=state,
                request="{}",
                placement="{}",
                created_at=NOW,
                expires_at=NOW if state == "pending" else None,
                live=True,
                anchor_node="n0",
                anchor_device=device,
            )
        )
        conn.execute(
            sa.insert(schema.gpu_holds).values(
                node="n0", device=device, kind="gpu", allocation_id=allocation
            )
        )
    return allocation


def _refused(engine: sa.Engine, write: Callable[[sa.Connection], Any]) -> None:
    with pytest.raises(IntegrityError), engine.begin() as conn:
        write(conn)


def _row(engine: sa.Engine, allocation: str) -> sa.RowMapping:
    with engine.connect() as conn:
        table = schema.allocations
        return conn.execute(sa.select(table).where(table.c.id == allocation)).mappings().one()


def test_a_live_allocation_that_holds_nothing_cannot_be_written(engine: sa.Engine) -> None:
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.insert(schema.allocations).values(
                id=str(uuid.uuid4()),
                state="active",
                request="{}",
                placement="{}",
                created_at=NOW,
                live=True,
                anchor_node="n0",
                anchor_device="GPU-nowhere",
            )
        ),
    )


def test_holds_cannot_be_dropped_while_the_allocation_stays_live(engine: sa.Engine) -> None:
    allocation = _live(engine)
    holds = schema.gpu_holds
    _refused(
        engine,
        lambda conn: conn.execute(sa.delete(holds).where(holds.c.allocation_id == allocation)),
    )


def test_an_allocation_cannot_end_and_keep_its_holds(engine: sa.Engine) -> None:
    allocation = _live(engine)
    table = schema.allocations
    _refused(
        engine,
        lambda conn: conn.execute(sa.update(table).where(table.c.id == allocation).values(**ENDED)),
    )
    assert _row(engine, allocation)["state"] == "pending"


def test_an_ended_allocation_cannot_come_back(engine: sa.Engine) -> None:
    """The lost race of confirm against release: `SET state='active' WHERE id=...`."""
    allocation = _live(engine)
    table, holds = schema.allocations, schema.gpu_holds
    with engine.begin() as conn:
        conn.execute(sa.update(table).where(table.c.id == allocation).values(**ENDED))
        conn.execute(sa.delete(holds).where(holds.c.allocation_id == allocation))
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.update(table).where(table.c.id == allocation).values(state="active", expires_at=None)
        ),
    )
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.update(table)
            .where(table.c.id == allocation)
            .values(state="active", live=True, anchor_node="n0", anchor_device="GPU-a")
        ),
    )
    assert _row(engine, allocation)["state"] == "released"


def test_a_gpu_is_held_once_and_for_its_own_allocation(engine: sa.Engine) -> None:
    first = _live(engine, device="GPU-a")
    holds = schema.gpu_holds
    second = _live(engine, device="GPU-b")
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.insert(holds).values(node="n0", device="GPU-a", kind="gpu", allocation_id=second)
        ),
    )
    table = schema.allocations
    # An allocation may not name another one's hold as its own.
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.update(table).where(table.c.id == second).values(anchor_device="GPU-a")
        ),
    )
    assert _row(engine, first)["anchor_device"] == "GPU-a"


def test_expiry_follows_the_state(engine: sa.Engine) -> None:
    pending = _live(engine, device="GPU-a")
    active = _live(engine, state="active", device="GPU-b")
    table = schema.allocations
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.update(table).where(table.c.id == pending).values(expires_at=None)
        ),
    )
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.update(table).where(table.c.id == active).values(expires_at=NOW)
        ),
    )
    _refused(
        engine,
        lambda conn: conn.execute(
            sa.update(table).where(table.c.id == active).values(state="lost")
        ),
    )
