"""Group commit: concurrent reservations share a transaction, a lost race stays one request's."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from service import migrate, schema
from service.allocations.group_commit import GroupCommitter, _Reservation


def _row(device: str) -> dict[str, object]:
    """A pending allocation whose one hold is ``device`` on n0."""
    now = datetime(2026, 6, 1, tzinfo=UTC)
    return {
        "id": str(uuid.uuid4()),
        "state": "pending",
        "job_id": None,
        "owner": None,
        "idempotency_key": None,
        "request": "{}",
        "placement": "{}",
        "created_at": now,
        "expires_at": now,
        "ended_at": None,
        "live": True,
        "anchor_node": "n0",
        "anchor_device": device,
    }


class HeldFirstBatch(GroupCommitter):
    """Holds its first write until released, so that later reservations queue up."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.sizes: list[int] = []

    def _write(self, batch: list[_Reservation]) -> None:
        if not self.sizes:
            self.entered.set()
            self.gate.wait(10)
        self.sizes.append(len(batch))
        super()._write(batch)


@pytest.fixture
def engine(database_url: str) -> sa.Engine:
    migrate.upgrade(database_url)
    return sa.create_engine(database_url)


def _submit(committer: GroupCommitter, device: str, errors: dict[str, BaseException]) -> None:
    try:
        committer.commit(_row(device), [("n0", device, "gpu")], ["n0"])
    except BaseException as exc:
        errors[device] = exc


def _wait_queued(committer: GroupCommitter, count: int) -> None:
    deadline = time.monotonic() + 10
    while committer._queue.qsize() < count:
        assert time.monotonic() < deadline, "reservations did not queue"
        time.sleep(0.005)


def _holders(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(schema.gpu_holds.c.device)).scalars())


def test_queued_reservations_commit_together(engine: sa.Engine) -> None:
    committer = HeldFirstBatch(engine)
    errors: dict[str, BaseException] = {}
    first = threading.Thread(target=_submit, args=(committer, "GPU-first", errors))
    first.start()
    assert committer.entered.wait(10)  # the committer took the first one and waits at the gate
    rest = [
        threading.Thread(target=_submit, args=(committer, f"GPU-{i}", errors)) for i in range(8)
    ]
    for t in rest:
        t.start()
    _wait_queued(committer, 8)
    committer.gate.set()
    for t in [first, *rest]:
        t.join(10)
    committer.stop()
    assert errors == {}
    assert committer.sizes == [1, 8]
    assert committer.committed == 9 and committer.batches == 2
    assert len(_holders(engine)) == 9


def test_a_lost_race_fails_only_its_own_reservation(engine: sa.Engine) -> None:
    committer = HeldFirstBatch(engine)
    errors: dict[str, BaseException] = {}
    # Another replica already holds GPU-2.
    with engine.begin() as conn:
        other = _row("GPU-2")
        conn.execute(sa.insert(schema.allocations).values(**other))
        conn.execute(
            sa.insert(schema.gpu_holds).values(
                node="n0", device="GPU-2", kind="gpu", allocation_id=other["id"]
            )
        )
    blocker = threading.Thread(target=_submit, args=(committer, "GPU-0", errors))
    blocker.start()
    assert committer.entered.wait(10)
    racers = [
        threading.Thread(target=_submit, args=(committer, f"GPU-{i}", errors)) for i in (1, 2, 3)
    ]
    for t in racers:
        t.start()
    _wait_queued(committer, 3)
    committer.gate.set()
    for t in [blocker, *racers]:
        t.join(10)
    committer.stop()
    assert list(errors) == ["GPU-2"] and isinstance(errors["GPU-2"], IntegrityError)
    assert _holders(engine) == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    with engine.connect() as conn:
        allocations = conn.execute(sa.select(sa.func.count()).select_from(schema.allocations))
        assert allocations.scalar() == 4  # the loser's allocation row rolled back with it


def test_a_database_error_reaches_the_caller() -> None:
    engine = sa.create_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    committer = GroupCommitter(engine)
    with pytest.raises(sa.exc.OperationalError):
        committer.commit(_row("GPU-0"), [("n0", "GPU-0", "gpu")], ["n0"])
    committer.stop()
