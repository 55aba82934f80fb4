"""The migrated database is exactly the schema the code uses."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command

from service import migrate, schema


def test_upgrade_head_creates_the_schema(database_url: str) -> None:
    migrate.upgrade(database_url)
    migrate.upgrade(database_url)  # idempotent
    engine = sa.create_engine(database_url)
    inspector = sa.inspect(engine)
    for table in schema.metadata.sorted_tables:
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        assert columns == {c.name for c in table.columns}, table.name
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        assert {i.name for i in table.indexes} <= indexes, table.name
    keys = inspector.get_pk_constraint("gpu_holds")["constrained_columns"]
    assert keys == ["node", "device"]
    with engine.connect() as conn:
        version = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar_one()
    engine.dispose()
    assert version == migrate.current_head()


def test_0009_finds_holds_and_shares_by_device(database_url: str) -> None:
    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    command.downgrade(config, "0008")
    engine = sa.create_engine(database_url)
    try:
        assert "ix_gpu_holds_device" not in _indexes(engine, "gpu_holds")
        command.upgrade(config, "0009")
        assert "ix_gpu_holds_device" in _indexes(engine, "gpu_holds")
        assert "ix_gpu_shares_device" in _indexes(engine, "gpu_shares")
    finally:
        engine.dispose()


def test_0010_adds_the_reuse_stamp_and_takes_it_away(database_url: str) -> None:
    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    command.downgrade(config, "0009")
    engine = sa.create_engine(database_url)
    try:
        assert "touched_at" not in _columns(engine, "allocations")
        command.upgrade(config, "0010")
        assert "touched_at" in _columns(engine, "allocations")
    finally:
        engine.dispose()


def test_0011_holds_name_the_snapshot_chosen_on(database_url: str) -> None:
    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    command.downgrade(config, "0010")
    engine = sa.create_engine(database_url)
    try:
        assert "node_seq" not in _columns(engine, "gpu_holds")
        assert "uq_nodes_name_seq" not in _indexes(engine, "nodes")
        command.upgrade(config, "0011")
        inspector = sa.inspect(engine)
        assert "node_seq" in _columns(engine, "gpu_holds")
        assert "uq_nodes_name_seq" in _indexes(engine, "nodes")
        keys = {k["name"]: k for k in inspector.get_foreign_keys("gpu_holds")}
        key = keys["fk_gpu_holds_node_seq"]
        assert (key["referred_table"], key["referred_columns"]) == ("nodes", ["name", "seq"])
        assert key["constrained_columns"] == ["node", "node_seq"]
        assert key["options"].get("onupdate") == "CASCADE"
    finally:
        engine.dispose()


def test_0012_remembers_ended_jobs(database_url: str) -> None:
    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    command.downgrade(config, "0011")
    engine = sa.create_engine(database_url)
    try:
        assert "ended_jobs" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()  # a pooled SQLite connection may keep the schema it read
    command.upgrade(config, "0012")
    engine = sa.create_engine(database_url)
    try:
        assert "ix_ended_jobs_ended_at" in _indexes(engine, "ended_jobs")
    finally:
        engine.dispose()


def test_0015_holds_name_the_node_row_chosen_on(database_url: str) -> None:
    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    command.downgrade(config, "0014")
    engine = sa.create_engine(database_url)
    try:
        assert not {"node_reported_at", "node_cordoned"} & _columns(engine, "gpu_holds")
        assert "uq_nodes_name_reported_cordoned" not in _indexes(engine, "nodes")
        command.upgrade(config, "0015")
        assert {"node_reported_at", "node_cordoned"} <= _columns(engine, "gpu_holds")
        assert "uq_nodes_name_reported_cordoned" in _indexes(engine, "nodes")
        keys = {k["name"]: k for k in sa.inspect(engine).get_foreign_keys("gpu_holds")}
        key = keys["fk_gpu_holds_node_state"]
        assert key["referred_table"] == "nodes"
        assert key["referred_columns"] == ["name", "reported_at", "cordoned"]
        assert key["constrained_columns"] == ["node", "node_reported_at", "node_cordoned"]
        assert key["options"].get("onupdate") == "CASCADE"
        assert "fk_gpu_holds_node_seq" in keys  # the snapshot's seq stays checked as it was
    finally:
        engine.dispose()


def test_0016_forwarded_keys_remember_their_request(database_url: str) -> None:
    """The column comes and goes; a key forwarded before it names no request (unchecked)."""
    from datetime import UTC, datetime

    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    engine = sa.create_engine(database_url)
    forwards = sa.table(
        "federation_forwards",
        *(sa.column(c) for c in ("idempotency_key", "region", "gpu_model", "created_at")),
    )
    try:
        command.downgrade(config, "0015")
        assert "request" not in _columns(engine, "federation_forwards")
        with engine.begin() as conn:
            conn.execute(forwards.delete())
            conn.execute(
                forwards.insert().values(
                    idempotency_key="k",
                    region="aws-east",
                    gpu_model="H100",
                    created_at=datetime(2026, 12, 5, tzinfo=UTC),
                )
            )
        command.upgrade(config, "0016")
        assert "request" in _columns(engine, "federation_forwards")
        t = schema.federation_forwards
        with engine.connect() as conn:
            row = conn.execute(sa.select(t.c.region, t.c.request)).one()
        assert tuple(row) == ("aws-east", None)
    finally:
        migrate.upgrade(database_url)
        engine.dispose()


def test_0017_copies_the_host_figures_out_of_the_stored_requests(database_url: str) -> None:
    """Rows written before the columns get the figures their request names, NULL for
    the rest; the columns come and go."""
    from datetime import UTC, datetime

    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    engine = sa.create_engine(database_url)
    old = sa.table(
        "allocations",
        *(sa.column(c) for c in ("id", "state", "request", "placement", "created_at", "ended_at")),
    )
    requests = {
        "both": '{"gpus":1,"cpu_milli":1500,"memory_mib":2048,"node_labels":{}}',
        "cpu": '{"gpus":1,"cpu_milli":250,"memory_mib":null}',
        "memory": '{"gpus":1,"cpu_milli":null,"memory_mib":512}',
        "nulls": '{"gpus":1,"cpu_milli":null,"memory_mib":null}',
        "before": '{"gpus":1,"tasks":1}',  # written before the fields existed
        "label": '{"gpus":1,"node_labels":{"cpu-milli":"5"}}',
        "broken": '{"cpu_milli":',
    }
    expected = {
        "both": (1500, 2048),
        "cpu": (250, None),
        "memory": (None, 512),
        "nulls": (None, None),
        "before": (None, None),
        "label": (None, None),
        "broken": (None, None),
    }
    now = datetime(2026, 12, 6, tzinfo=UTC)
    try:
        command.downgrade(config, "0016")
        assert "cpu_milli" not in _columns(engine, "allocations")
        with engine.begin() as conn:
            conn.execute(
                sa.insert(old),
                [
                    {
                        "id": name,
                        "state": "released",
                        "request": text,
                        "placement": "{}",
                        "created_at": now,
                        "ended_at": now,
                    }
                    for name, text in requests.items()
                ],
            )
        command.upgrade(config, "0017")
        t = schema.allocations
        with engine.connect() as conn:
            rows = conn.execute(sa.select(t.c.id, t.c.cpu_milli, t.c.memory_mib)).all()
        assert {str(i): (c, m) for i, c, m in rows} == expected
        command.downgrade(config, "0016")
        assert "memory_mib" not in _columns(engine, "allocations")
    finally:
        migrate.upgrade(database_url)
        engine.dispose()


def test_0018_counts_the_held_instances_of_each_gpu_in_its_pool(database_url: str) -> None:
    """Instance holds written before the pools get their GPU from their allocation's
    placement and a pool with their count; a GPU also held whole gets none."""
    import json
    from datetime import UTC, datetime

    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    engine = sa.create_engine(database_url)
    allocations = sa.table(
        "allocations",
        *(
            sa.column(c)
            for c in (
                *("id", "state", "request", "placement", "created_at", "live"),
                *("anchor_node", "anchor_device"),
            )
        ),
    )
    holds = sa.table(
        "gpu_holds", *(sa.column(c) for c in ("node", "device", "kind", "allocation_id", "live"))
    )
    placed = {  # allocation -> (instance, its GPU)
        "a": ("MIG-a", "GPU-0"),
        "b": ("MIG-b", "GPU-0"),
        "c": ("MIG-c", "GPU-1"),
        "d": ("MIG-d", "GPU-2"),
    }
    now = datetime(2026, 12, 7, tzinfo=UTC)
    try:
        command.downgrade(config, "0017")
        with engine.begin() as conn:
            for allocation_id, (instance, gpu) in placed.items():
                task = {"node": "n0", "gpu_uuids": [gpu], "mig_uuids": [instance]}
                conn.execute(
                    sa.insert(allocations),
                    {
                        "id": allocation_id,
                        "state": "active",
                        "request": "{}",
                        "placement": json.dumps({"tasks": [task]}),
                        "created_at": now,
                        "live": True,
                        "anchor_node": "n0",
                        "anchor_device": instance,
                    },
                )
                conn.execute(
                    sa.insert(holds),
                    {
                        "node": "n0",
                        "device": instance,
                        "kind": "mig",
                        "allocation_id": allocation_id,
                        "live": True,
                    },
                )
            whole = {"node": "n0", "gpu_uuids": ["GPU-2"], "mig_uuids": []}
            conn.execute(
                sa.insert(allocations),
                {
                    "id": "w",
                    "state": "active",
                    "request": "{}",
                    "placement": json.dumps({"tasks": [whole]}),
                    "created_at": now,
                    "live": True,
                    "anchor_node": "n0",
                    "anchor_device": "GPU-2",
                },
            )
            conn.execute(
                sa.insert(holds),
                {
                    "node": "n0",
                    "device": "GPU-2",
                    "kind": "gpu",
                    "allocation_id": "w",
                    "live": True,
                },
            )
        command.upgrade(config, "0018")
        h = schema.gpu_holds
        with engine.connect() as conn:
            rows = conn.execute(sa.select(h.c.device, h.c.kind, h.c.instances, h.c.parent)).all()
        assert sorted(tuple(r) for r in rows) == [
            ("GPU-0", "migpool", 2, None),
            ("GPU-1", "migpool", 1, None),
            ("GPU-2", "gpu", None, None),
            ("MIG-a", "mig", None, "GPU-0"),
            ("MIG-b", "mig", None, "GPU-0"),
            ("MIG-c", "mig", None, "GPU-1"),
            ("MIG-d", "mig", None, None),
        ]
        command.downgrade(config, "0017")
        assert "instances" not in _columns(engine, "gpu_holds")
        with engine.connect() as conn:
            kinds = conn.execute(sa.text("SELECT kind FROM gpu_holds")).scalars().all()
        assert sorted(kinds) == ["gpu", "mig", "mig", "mig", "mig"]
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM gpu_holds"))
            conn.execute(sa.text("DELETE FROM allocations"))
        migrate.upgrade(database_url)
        engine.dispose()


def _columns(engine: sa.Engine, table: str) -> set[str]:
    return {str(c["name"]) for c in sa.inspect(engine).get_columns(table)}


def _indexes(engine: sa.Engine, table: str) -> set[str]:
    return {str(i["name"]) for i in sa.inspect(engine).get_indexes(table)}


def test_0003_mends_rows_the_lifecycle_races_left(database_url: str) -> None:
    """Live allocations that hold nothing end; holds of ended ones go; the rest stay live."""
    from datetime import UTC, datetime

    engine = sa.create_engine(database_url)
    with engine.begin() as conn:  # a fresh database at 0002
        tables = (
            "gpu_shares",
            "gpu_holds",
            "allocations",
            "node_snapshots",
            "nodes",
            "node_keys",
            "api_tokens",
            "regions",
            "federation_forwards",
            "audit_log",
            "ended_jobs",
            "k8s_report_order",
        )
        for table in tables:
            conn.execute(
                sa.text(
                    f"DROP TABLE IF EXISTS {table} CASCADE"
                    if conn.dialect.name == "postgresql"
                    else f"DROP TABLE IF EXISTS {table}"
                )
            )
        conn.execute(sa.text("DROP TABLE IF EXISTS alembic_version"))
    migrate.upgrade(database_url, "0002")
    now = datetime(2026, 6, 1, tzinfo=UTC)
    old = sa.table(
        "allocations",
        *(
            sa.column(c)
            for c in ("id", "state", "request", "placement", "created_at", "expires_at")
        ),
    )
    holds = sa.table(
        "gpu_holds", *(sa.column(c) for c in ("node", "device", "kind", "allocation_id"))
    )
    rows = {
        "held": ("active", now),  # an active one with a stray expiry: kept, expiry dropped
        "empty": ("active", None),  # live, holds nothing: ended
        "ended": ("released", None),  # ended, still holding: its hold goes
    }
    with engine.begin() as conn:
        for name, (state, expires) in rows.items():
            conn.execute(
                sa.insert(old).values(
                    id=name,
                    state=state,
                    request="{}",
                    placement="{}",
                    created_at=now,
                    expires_at=expires,
                )
            )
        conn.execute(
            sa.insert(holds).values(node="n0", device="GPU-b", kind="gpu", allocation_id="held")
        )
        conn.execute(
            sa.insert(holds).values(node="n0", device="GPU-a", kind="gpu", allocation_id="held")
        )
        conn.execute(
            sa.insert(holds).values(node="n0", device="GPU-c", kind="gpu", allocation_id="ended")
        )

    migrate.upgrade(database_url)

    with engine.connect() as conn:
        table = schema.allocations
        after = {r["id"]: r for r in conn.execute(sa.select(table)).mappings()}
        held = sorted(conn.execute(sa.select(schema.gpu_holds.c.device)).scalars())
    engine.dispose()
    assert held == ["GPU-a", "GPU-b"]
    assert after["held"]["state"] == "active" and after["held"]["expires_at"] is None
    assert (after["held"]["anchor_node"], after["held"]["anchor_device"]) == ("n0", "GPU-a")
    assert after["empty"]["state"] == "released" and after["empty"]["ended_at"] is not None
    assert after["ended"]["state"] == "released" and after["ended"]["live"] is None


def test_0019_keeps_the_newest_list_each_node_reported(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = sa.create_engine(database_url)
    try:
        keys = sa.inspect(engine).get_pk_constraint("k8s_report_order")["constrained_columns"]
        assert keys == ["node", "resource"]
        command.downgrade(migrate.alembic_config(database_url), "0018")
        assert not sa.inspect(engine).has_table("k8s_report_order")
        migrate.upgrade(database_url)
        assert sa.inspect(engine).has_table("k8s_report_order")
    finally:
        engine.dispose()


def test_0004_adds_and_removes_the_tokens_table(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = sa.create_engine(database_url)
    try:
        assert sa.inspect(engine).has_table("api_tokens")
        command.downgrade(migrate.alembic_config(database_url), "0003")
        assert not sa.inspect(engine).has_table("api_tokens")
        migrate.upgrade(database_url)
        assert sa.inspect(engine).has_table("api_tokens")
    finally:
        engine.dispose()


def test_0006_keeps_the_tokens_and_takes_the_region_role(database_url: str) -> None:
    """The role check is rebuilt (a table copy on SQLite): tokens survive, `region` is new."""
    from datetime import UTC, datetime

    engine = sa.create_engine(database_url)
    cascade = " CASCADE" if engine.dialect.name == "postgresql" else ""
    with engine.begin() as conn:
        for table in (
            "k8s_report_order",
            "ended_jobs",
            "audit_log",
            "federation_forwards",
            "regions",
            "gpu_shares",
            "gpu_holds",
            "allocations",
            "node_snapshots",
            "nodes",
            "node_keys",
            "api_tokens",
            "alembic_version",
        ):
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}{cascade}"))
    migrate.upgrade(database_url, "0004")
    tokens = sa.table(
        "api_tokens", *(sa.column(c) for c in ("id", "role", "secret_hash", "created_at"))
    )
    now = datetime(2026, 12, 2, tzinfo=UTC)
    with engine.begin() as conn:
        conn.execute(tokens.insert().values(id="a1", role="admin", secret_hash="h", created_at=now))
    migrate.upgrade(database_url)
    with engine.begin() as conn:
        conn.execute(
            tokens.insert().values(id="r1", role="region", secret_hash="h", created_at=now)
        )
        roles = dict(conn.execute(sa.text("SELECT id, role FROM api_tokens")).all())
    assert roles == {"a1": "admin", "r1": "region"}
    try:
        with engine.begin() as conn:
            conn.execute(
                tokens.insert().values(id="x1", role="root", secret_hash="h", created_at=now)
            )
    except sa.exc.IntegrityError:
        pass
    else:
        raise AssertionError("the role check let 'root' in")
    engine.dispose()


def test_0005_adds_and_removes_the_audit_log(database_url: str) -> None:
    migrate.upgrade(database_url)
    engine = sa.create_engine(database_url)
    try:
        assert sa.inspect(engine).has_table("audit_log")
        command.downgrade(migrate.alembic_config(database_url), "0004")
        assert not sa.inspect(engine).has_table("audit_log")
        assert sa.inspect(engine).has_table("api_tokens")
        migrate.upgrade(database_url)
        assert sa.inspect(engine).has_table("audit_log")
    finally:
        engine.dispose()


def test_0007_adds_shares_and_a_downgrade_ends_the_share_allocations(database_url: str) -> None:
    """Up: the share tables and checks; down: share allocations end as released, their
    pools and shares go, whole-GPU allocations stay; up again works."""
    from datetime import UTC, datetime

    migrate.upgrade(database_url)
    engine = sa.create_engine(database_url)
    now = datetime(2026, 12, 3, tzinfo=UTC)
    base = {"request": "{}", "placement": "{}", "created_at": now, "live": True}
    none = {"anchor_node": None, "anchor_device": None, "share_node": None, "share_device": None}
    with engine.begin() as conn:
        conn.execute(
            schema.allocations.insert(),
            [
                {
                    **base,
                    **none,
                    "id": "whole",
                    "state": "active",
                    "anchor_node": "n0",
                    "anchor_device": "GPU-a",
                },
                {
                    **base,
                    **none,
                    "id": "share",
                    "state": "active",
                    "share_node": "n0",
                    "share_device": "GPU-b",
                },
            ],
        )
        conn.execute(
            schema.gpu_holds.insert(),
            [
                {
                    "node": "n0",
                    "device": "GPU-a",
                    "kind": "gpu",
                    "allocation_id": "whole",
                    "share_milli": None,
                },
                {
                    "node": "n0",
                    "device": "GPU-b",
                    "kind": "shared",
                    "allocation_id": None,
                    "share_milli": 250,
                },
            ],
        )
        conn.execute(
            schema.gpu_shares.insert(),
            {"node": "n0", "device": "GPU-b", "allocation_id": "share", "milli": 250},
        )
    try:
        command.downgrade(migrate.alembic_config(database_url), "0006")
        assert not sa.inspect(engine).has_table("gpu_shares")
        with engine.connect() as conn:
            states = dict(conn.execute(sa.text("SELECT id, state FROM allocations")).all())
            holds = conn.execute(sa.text("SELECT device, allocation_id FROM gpu_holds")).all()
        assert states == {"whole": "active", "share": "released"}
        assert [tuple(h) for h in holds] == [("GPU-a", "whole")]
        migrate.upgrade(database_url)
        assert sa.inspect(engine).has_table("gpu_shares")
    finally:
        engine.dispose()


def test_0008_keys_take_the_seq_of_their_nodes_signed_snapshot(database_url: str) -> None:
    """Up: a key whose node holds a signed snapshot takes its seq, others none; down: the
    column goes; up again works."""
    from datetime import UTC, datetime

    migrate.upgrade(database_url)
    engine = sa.create_engine(database_url)
    config = migrate.alembic_config(database_url)
    now = datetime(2026, 12, 4, tzinfo=UTC)
    try:
        command.downgrade(config, "0007")
        node = sa.text(
            "INSERT INTO nodes (name, region, snapshot, seq, signature, reported_at,"
            " heartbeat_at) VALUES (:name, 'default', '{}', :seq, :signature, :now, :now)"
        )
        key = sa.text(
            "INSERT INTO node_keys (node, algorithm, public_key, registered_at)"
            " VALUES (:node, 'ed25519', 'k', :now)"
        )
        with engine.begin() as conn:
            conn.execute(node, {"name": "signed", "seq": 41, "signature": "s", "now": now})
            conn.execute(node, {"name": "unsigned", "seq": 7, "signature": None, "now": now})
            for name in ("signed", "unsigned", "not-reported"):
                conn.execute(key, {"node": name, "now": now})
        migrate.upgrade(database_url)
        with engine.connect() as conn:
            seqs = dict(conn.execute(sa.text("SELECT node, seq FROM node_keys")).all())
        assert seqs == {"signed": 41, "unsigned": None, "not-reported": None}
        command.downgrade(config, "0007")
        columns = {c["name"] for c in sa.inspect(engine).get_columns("node_keys")}
        assert "seq" not in columns
        migrate.upgrade(database_url)
    finally:
        engine.dispose()


def test_0013_holds_forwarded_keys_and_keeps_the_forwards(database_url: str) -> None:
    """The columns come and go; a key forwarded before is held by nobody after."""
    from datetime import UTC, datetime

    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    command.downgrade(config, "0012")
    engine = sa.create_engine(database_url)
    forwards = sa.table(
        "federation_forwards",
        *(sa.column(c) for c in ("idempotency_key", "region", "gpu_model", "created_at")),
    )
    try:
        with engine.begin() as conn:
            conn.execute(forwards.delete())
            conn.execute(
                forwards.insert().values(
                    idempotency_key="k",
                    region="aws-east",
                    gpu_model="H100",
                    created_at=datetime(2026, 12, 5, tzinfo=UTC),
                )
            )
        command.upgrade(config, "0013")
        with engine.connect() as conn:
            t = schema.federation_forwards  # the columns 0013 made, not those added since
            row = conn.execute(sa.select(t.c.region, t.c.holder, t.c.held_until)).one()
        assert tuple(row) == ("aws-east", None, None)
        command.downgrade(config, "0012")
        columns = {c["name"] for c in sa.inspect(engine).get_columns("federation_forwards")}
        assert "holder" not in columns and "held_until" not in columns
        migrate.upgrade(database_url)
    finally:
        engine.dispose()


def test_0014_finds_forwarded_keys_by_age(database_url: str) -> None:
    migrate.upgrade(database_url)
    config = migrate.alembic_config(database_url)
    engine = sa.create_engine(database_url)

    def indexes() -> set[str]:
        return {i["name"] for i in sa.inspect(engine).get_indexes("federation_forwards")}

    try:
        command.downgrade(config, "0013")
        assert "ix_federation_forwards_created_at" not in indexes()
        command.upgrade(config, "0014")
        assert "ix_federation_forwards_created_at" in indexes()
    finally:
        migrate.upgrade(database_url)
        engine.dispose()
