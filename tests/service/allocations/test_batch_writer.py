"""The driver-level batch writer stores what SQLAlchemy reads back, all or nothing."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from service import migrate, schema
from service.allocations.batch_writer import BatchWriter
from service.audit import records
from service.db import make_engine
from service.notify import CHANNEL, ORIGIN


@pytest.fixture
def engine(database_url: str) -> sa.Engine:
    migrate.upgrade(database_url)
    return make_engine(database_url)


def _row(anchor: str = "GPU-a", **changes: Any) -> dict[str, Any]:
    """A live allocation row; ``anchor``: the device of its hold that it names."""
    row = {
        "id": str(uuid.uuid4()),
        "state": "active",
        "job_id": "job-7",
        "owner": "slurm:ana",
        "idempotency_key": None,
        "request": '{"gpus": 2}',
        "placement": '{"tasks": [{"node": "n0"}]}',
        "created_at": datetime(2026, 6, 1, 12, 30, 45, 123456, tzinfo=UTC),
        "expires_at": None,
        "ended_at": None,
        "touched_at": None,
        "live": True,
        "anchor_node": "n0",
        "anchor_device": anchor,
        "share_node": None,
        "share_device": None,
        "cpu_milli": None,
        "memory_mib": None,
    }
    return row | changes


def _hold(allocation: dict[str, Any], device: str, kind: str = "gpu") -> dict[str, Any]:
    return {
        "node": "n0",
        "device": device,
        "kind": kind,
        "allocation_id": allocation["id"],
        "live": True,
        "share_milli": None,
        "instances": None,
        "parent": None,
        "node_seq": None,
        "node_reported_at": None,
        "node_cordoned": None,
    }


def test_rows_and_holds_read_back_as_written(engine: sa.Engine) -> None:
    first = _row(
        expires_at=datetime(2026, 6, 1, 12, 32, tzinfo=UTC),
        state="pending",
        cpu_milli=500,
        memory_mib=1024,
    )
    second = _row("GPU-b", job_id=None, owner=None, idempotency_key="key-1")
    holds = [_hold(first, "GPU-a"), _hold(first, "cpu:3", "cpu"), _hold(second, "GPU-b")]

    BatchWriter(engine).write([first, second], holds, ["n0"])

    with engine.connect() as conn:
        rows = {r["id"]: dict(r) for r in conn.execute(sa.select(schema.allocations)).mappings()}
        held = conn.execute(sa.select(schema.gpu_holds).order_by("device")).mappings().all()
    for written in (first, second):
        stored = rows[written["id"]]
        for key in ("created_at", "expires_at"):
            value = stored[key]
            # SQLite keeps no zone: the service reads naive times as UTC (service._time).
            if value is not None and value.tzinfo is None:
                stored[key] = value.replace(tzinfo=UTC)
        assert stored == written
    assert [dict(h) for h in held] == sorted(holds, key=lambda h: h["device"])


def test_stored_values_are_those_sqlalchemy_stores(engine: sa.Engine) -> None:
    # SQLite compares times as text (the expiry sweep's `expires_at < now`), so the
    # stored text must be SQLAlchemy's to the character.
    expires = datetime(2026, 6, 1, 12, 31, 0, 5, tzinfo=UTC)
    by_core = _row("GPU-a", expires_at=expires, state="pending")
    by_writer = _row("GPU-b", expires_at=expires, state="pending")
    with engine.begin() as conn:
        conn.execute(sa.insert(schema.allocations), by_core)
        conn.execute(sa.insert(schema.gpu_holds), _hold(by_core, "GPU-a"))
    BatchWriter(engine).write([by_writer], [_hold(by_writer, "GPU-b")], [])

    def stored(row: dict[str, Any]) -> tuple[Any, ...]:
        table = schema.allocations
        with engine.connect() as conn:
            skip = {"id", "anchor_device"}
            raw = conn.execute(
                sa.select(*(sa.cast(c, sa.Text) for c in table.columns if c.key not in skip)).where(
                    table.c.id == row["id"]
                )
            )
            return tuple(raw.one())

    assert stored(by_writer) == stored(by_core)


def test_a_gpu_held_twice_fails_the_whole_batch_as_sqlalchemy_would(engine: sa.Engine) -> None:
    writer = BatchWriter(engine)
    taken = _row()
    writer.write([taken], [_hold(taken, "GPU-a")], ["n0"])
    late, clean = _row(), _row("GPU-b")

    with pytest.raises(IntegrityError):
        writer.write([clean, late], [_hold(clean, "GPU-b"), _hold(late, "GPU-a")], ["n0"])

    with engine.connect() as conn:
        ids = set(conn.execute(sa.select(schema.allocations.c.id)).scalars())
        devices = set(conn.execute(sa.select(schema.gpu_holds.c.device)).scalars())
    assert ids == {taken["id"]} and devices == {"GPU-a"}
    # The connection went back to the pool usable: the next batch commits.
    writer.write([clean], [_hold(clean, "GPU-b")], ["n0"])


def test_postgres_hears_the_batch_in_the_same_transaction(postgres_url: str) -> None:
    migrate.upgrade(postgres_url)
    engine = make_engine(postgres_url)
    dsn = sa.make_url(postgres_url).set(drivername="postgresql").render_as_string(False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        row = _row("GPU-n")
        BatchWriter(engine).write([row], [_hold(row, "GPU-n")], ["n1", "n0", "n1"])
        heard = next(listener.notifies(timeout=5, stop_after=1))
    assert heard.channel == CHANNEL
    body = json.loads(heard.payload)
    assert body["origin"] == ORIGIN and body["nodes"] == ["n0", "n1"]
    assert abs(body["at"] - time.time()) < 60  # the sender's clock: replicas measure lag by it
    engine.dispose()


def _audit(allocation: dict[str, Any]) -> dict[str, Any]:
    return records.placed(
        allocation["created_at"],
        allocation["id"],
        allocation["job_id"],
        ["n0"],
        allocation["state"],
        allocation["request"],
        allocation["placement"],
    )


def test_a_decision_and_its_audit_row_commit_together_or_not_at_all(engine: sa.Engine) -> None:
    writer = BatchWriter(engine)
    taken = _row()
    writer.write([taken], [_hold(taken, "GPU-a")], ["n0"], [_audit(taken)])
    late, clean = _row(), _row("GPU-b")
    with pytest.raises(IntegrityError):
        writer.write(
            [clean, late],
            [_hold(clean, "GPU-b"), _hold(late, "GPU-a")],
            ["n0"],
            [_audit(clean), _audit(late)],
        )

    def audited() -> list[str]:
        with engine.connect() as conn:
            query = sa.select(schema.audit_log.c.allocation_id).order_by(schema.audit_log.c.id)
            return list(conn.execute(query).scalars())

    assert audited() == [taken["id"]]  # the failed batch left no row of its decisions
    writer.write([clean], [_hold(clean, "GPU-b")], ["n0"], [_audit(clean)])
    assert audited() == [taken["id"], clean["id"]]
    with engine.connect() as conn:
        detail = conn.execute(sa.select(schema.audit_log.c.detail)).scalars().first()
    assert detail is not None and '"request": {"gpus": 2}' in detail


def _postgres_only(engine: sa.Engine) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip("the pipeline and its round trips are Postgres's")


def test_a_postgres_batch_is_one_round_trip(engine: sa.Engine, tmp_path: Path) -> None:
    _postgres_only(engine)
    writer = BatchWriter(engine)
    trace = tmp_path / "libpq.trace"
    traced_connections: list[Any] = []
    with trace.open("w") as sink:

        def traced(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
            dbapi_connection.pgconn.trace(sink.fileno())
            dbapi_connection.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            traced_connections.append(dbapi_connection)

        sa.event.listen(engine, "checkout", traced)
        try:
            row = _row()
            writer.write([row], [_hold(row, "GPU-a")], ["n0"], [_audit(row)])
            other = _row("GPU-b")
            writer.write_now([other], [_hold(other, "GPU-b")], [])
        finally:
            sa.event.remove(engine, "checkout", traced)
            for connection in traced_connections:
                connection.pgconn.untrace()  # libpq writes what it buffered
            writer.close()
    lines = trace.read_text().splitlines()
    sent = [line.split("\t")[2].strip() for line in lines if line.startswith("F")]
    # Each write waits for the server once: no BEGIN or COMMIT of its own to wait on.
    assert sent.count("Sync") == 2 and "Query" not in sent, sent


def test_a_pooled_connection_goes_back_in_its_transaction_mode(engine: sa.Engine) -> None:
    _postgres_only(engine)
    writer = BatchWriter(engine)
    row = _row()
    writer.write([row], [_hold(row, "GPU-a")], ["n0"])
    with pytest.raises(IntegrityError):
        writer.write([_row()], [_hold(_row(), "GPU-a")], ["n0"])
    connection = engine.raw_connection()
    try:
        assert connection.dbapi_connection is not None
        assert connection.dbapi_connection.autocommit is False
    finally:
        connection.close()


def test_a_deferred_check_that_fails_at_the_commit_leaves_nothing(engine: sa.Engine) -> None:
    writer = BatchWriter(engine)
    orphan = _row("GPU-z")  # names a hold the batch does not write: checked at the commit
    held = _row("GPU-c")
    with pytest.raises(IntegrityError):
        writer.write([held, orphan], [_hold(held, "GPU-c")], ["n0"], [_audit(held)])
    with engine.connect() as conn:
        for table in (schema.allocations, schema.gpu_holds, schema.audit_log):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 0
    for i in range(12):  # and the next batch commits, at every point of the prepare count
        with pytest.raises(IntegrityError):
            writer.write([_row("GPU-z")], [], ["n0"])
        clean = _row(f"GPU-{i}")
        writer.write([clean], [_hold(clean, f"GPU-{i}")], ["n0"], [_audit(clean)])


def test_two_writers_racing_for_one_gpu_leave_one_whole_reservation(engine: sa.Engine) -> None:
    # Two replicas' writers, each on its own engine, send the same GPU at the same moment,
    # round after round: one wins each round, the other's batch leaves nothing, and both
    # writers' connections stay usable for the next round (on Postgres the statements
    # the refused batch had meant to prepare among them).
    other = make_engine(engine.url.render_as_string(hide_password=False))
    writers = [BatchWriter(engine), BatchWriter(other)]

    def race(device: str) -> list[str]:
        rows = [_row(device), _row(device)]
        results = ["", ""]
        start = threading.Barrier(2)

        def write(i: int) -> None:
            start.wait()
            try:
                writers[i].write([rows[i]], [_hold(rows[i], device)], ["n0"], [_audit(rows[i])])
                results[i] = "won"
            except IntegrityError:
                results[i] = "refused"

        threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sorted(results)

    outcomes = [race(f"GPU-race-{round_}") for round_ in range(20)]
    other.dispose()
    assert all(pair == ["refused", "won"] for pair in outcomes), outcomes
    with engine.connect() as conn:
        for table in (schema.allocations, schema.gpu_holds, schema.audit_log):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar() == 20


def test_a_refused_batch_never_spoils_the_next_one(engine: sa.Engine) -> None:
    # A refusal at every point of the driver's count towards preparing its statements
    # (psycopg prepares one on its fifth run): the batch after each refusal commits.
    writer = BatchWriter(engine)
    taken = _row("GPU-a")
    writer.write([taken], [_hold(taken, "GPU-a")], ["n0"], [_audit(taken)])
    for i in range(12):
        late = _row("GPU-a")
        with pytest.raises(IntegrityError):
            writer.write([late], [_hold(late, "GPU-a")], ["n0"], [_audit(late)])
        clean = _row(f"GPU-{i}")
        writer.write([clean], [_hold(clean, f"GPU-{i}")], ["n0"], [_audit(clean)])
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.gpu_holds)).scalar() == 13
