"""Advisory locks on Postgres: a bounded number per transaction, whatever a request names.

Postgres keeps every advisory lock in its shared lock table (max_locks_per_transaction
x max_connections slots for the whole server): one report naming 4,095 device UUIDs,
a lock each, filled it, and every other transaction that needed a lock (other reports,
pg_dump) failed with "out of shared memory".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from service.allocations import ended_jobs
from service.nodes import repository
from tests.service.conftest import _truncate

# The most advisory locks one transaction takes in one namespace.
BOUND = 64
_LONG_AGO = datetime(2000, 1, 1, tzinfo=UTC)


@pytest.fixture
def engine(postgres_url: str) -> Iterator[sa.Engine]:
    _truncate(postgres_url)
    engine = sa.create_engine(postgres_url)
    yield engine
    engine.dispose()


def _lock_uuids(conn: Connection, names: Iterable[str]) -> None:
    repository.lock_device_uuids(conn, names)


def _lock_jobs(conn: Connection, names: Iterable[str]) -> None:
    ended_jobs.lock(conn, names, _LONG_AGO)


LOCKERS = pytest.mark.parametrize("take", [_lock_uuids, _lock_jobs], ids=["uuids", "jobs"])


def _held(conn: Connection) -> int:
    query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    return int(conn.execute(sa.text(query)).scalar_one())


@LOCKERS
def test_many_names_take_a_bounded_number_of_locks(
    engine: sa.Engine, take: Callable[[Connection, Iterable[str]], None]
) -> None:
    # 63 GPUs and 63 x 64 MIG instances: the most device UUIDs a snapshot may list.
    names = [f"MIG-{i:08x}-0000-0000-0000-000000000000" for i in range(4095)]
    with engine.begin() as conn:
        take(conn, names)
        assert 0 < _held(conn) <= BOUND


@LOCKERS
def test_one_name_in_two_transactions_still_waits(
    engine: sa.Engine, take: Callable[[Connection, Iterable[str]], None]
) -> None:
    with engine.begin() as first, engine.begin() as second:
        take(first, ["GPU-shared", *(f"GPU-{i}" for i in range(500))])
        second.execute(sa.text("SET LOCAL lock_timeout = '200ms'"))
        with pytest.raises(OperationalError, match="lock timeout"):
            take(second, ["GPU-other", "GPU-shared"])
