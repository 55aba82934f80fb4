"""The allocation lifecycle's guarded transitions: each race of the state machine, fixed.

Each test here failed on the service before the transitions became single
conditional statements: a confirm that read `pending` and then wrote
`active` over a release (an active allocation holding nothing), a confirm
or an extend that won over an expired TTL, a whole group-commit batch lost
to one bad reservation, and a tentative choice left in memory by a request
whose commit failed.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.exc import DataError

from placement.profiles import build_profile
from service import schema
from service.allocations import api, repository
from service.allocations.group_commit import GroupCommitter
from service.allocations.results import Observation
from service.allocations.schemas import PlaceRequest
from service.app import create_app
from service.db import make_engine
from service.edge import revoked_meanwhile
from service.nodes import service as nodes
from service.nodes.schemas import SnapshotReport
from service.settings import Settings
from service.state import ServiceState
from service.tokens.presented import Unauthorized
from tests.service.conftest import FakeClock, _truncate, secured
from tests.service.helpers import add_nodes


def _free(client: TestClient, node: str) -> int:
    return len(client.get(f"/v1/nodes/{node}").json()["free_gpus"])


def _holds(client: TestClient) -> int:
    engine: sa.Engine = client.app.state.service.engine  # type: ignore[attr-defined]
    with engine.connect() as conn:
        return int(
            conn.execute(sa.select(sa.func.count()).select_from(schema.gpu_holds)).scalar_one()
        )


def test_confirm_at_expiry_expires_instead(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    lapse = client.post("/v1/place", json={"gpus": 4, "ttl_s": 30}).json()
    clock.advance(30)  # exactly at the expiry: the TTL has passed, no sweep has run yet
    client.post("/v1/nodes/h0/heartbeat")

    refused = client.post(f"/v1/allocations/{lapse['id']}/confirm")

    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["detail"]["state"] == "expired"
    assert client.get(f"/v1/allocations/{lapse['id']}").json()["state"] == "expired"
    assert _holds(client) == 0 and _free(client, "h0") == 8


def test_extend_at_expiry_expires_instead(client: TestClient, clock: FakeClock) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    lapse = client.post("/v1/place", json={"gpus": 2, "ttl_s": 30}).json()
    clock.advance(31)
    client.post("/v1/nodes/h0/heartbeat")

    refused = client.post(f"/v1/allocations/{lapse['id']}/extend", json={"ttl_s": 60})

    assert refused.status_code == 409 and refused.json()["error"]["detail"]["state"] == "expired"
    assert _holds(client) == 0 and _free(client, "h0") == 8


def test_a_released_allocation_cannot_be_confirmed(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    allocation = client.post("/v1/place", json={"gpus": 2}).json()
    client.post(f"/v1/allocations/{allocation['id']}/release")

    refused = client.post(f"/v1/allocations/{allocation['id']}/confirm")

    assert refused.status_code == 409 and refused.json()["error"]["detail"]["state"] == "released"
    assert client.get(f"/v1/allocations/{allocation['id']}").json()["state"] == "released"
    assert client.post(f"/v1/allocations/{allocation['id']}/release").json()["released"] == []
    assert client.post(f"/v1/allocations/{uuid.uuid4()}/confirm").status_code == 404


def test_confirm_twice_answers_the_same(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    allocation = client.post("/v1/place", json={"gpus": 2}).json()
    first = client.post(f"/v1/allocations/{allocation['id']}/confirm")
    again = client.post(f"/v1/allocations/{allocation['id']}/confirm")
    assert first.status_code == again.status_code == 200
    assert again.json()["state"] == "active" and again.json()["expires_at"] is None


def _replica(database_url: str) -> ServiceState:
    settings = Settings(database_url=database_url, heartbeat_ttl_s=3600)
    state = ServiceState(settings, make_engine(database_url))
    state.load()
    return state


def test_release_racing_confirm_on_two_replicas_never_leaves_an_empty_live_allocation(
    postgres_url: str,
) -> None:
    _truncate(postgres_url)
    a, b = _replica(postgres_url), _replica(postgres_url)
    snap = build_profile("hgx-h100", "h0")
    nodes.report_snapshot(a, "h0", SnapshotReport(snapshot=snap))
    b.sync_nodes(None)
    outcomes: dict[str, int] = {"confirmed": 0, "refused": 0}
    try:
        for _ in range(40):
            allocation = api.place(a, PlaceRequest(gpus=8), None).allocation
            start = threading.Barrier(2)

            def confirming(
                allocation_id: str = allocation.id, start: threading.Barrier = start
            ) -> None:
                start.wait()
                try:
                    api.confirm(a, allocation_id)
                    outcomes["confirmed"] += 1
                except Exception as exc:  # the Conflict of a release that won
                    assert getattr(exc, "status", None) == 409, exc
                    outcomes["refused"] += 1

            def releasing(
                allocation_id: str = allocation.id, start: threading.Barrier = start
            ) -> None:
                start.wait()
                assert api.release(b, allocation_id).ids == (allocation_id,)

            with ThreadPoolExecutor(2) as pool:
                for done in [pool.submit(confirming), pool.submit(releasing)]:
                    done.result()
            with a.engine.connect() as conn:
                row = repository.by_id(conn, allocation.id)
                held = conn.execute(
                    sa.select(sa.func.count()).select_from(schema.gpu_holds)
                ).scalar_one()
            assert row is not None and row["state"] == "released" and held == 0
            # Both replicas see the node whole again (b by its own release, a by reading back).
            a.sync_nodes(["h0"])
            for replica in (a, b):
                with replica.lock:
                    assert replica.cluster.node("h0").free_mask == 0xFF
    finally:
        for replica in (a, b):
            replica.committer.stop()
            replica.engine.dispose()
    assert outcomes["confirmed"] + outcomes["refused"] == 40


def test_one_bad_reservation_does_not_fail_its_batch(postgres_url: str) -> None:
    """A value the database refuses (a NUL byte, on Postgres) fails only its own request."""
    _truncate(postgres_url)
    engine = make_engine(postgres_url)
    committer = GroupCommitter(engine)
    gate, entered = threading.Event(), threading.Event()
    write = committer._write

    def held_first(batch: list) -> None:  # type: ignore[type-arg]
        if not entered.is_set():
            entered.set()
            gate.wait(10)
        write(batch)

    committer._write = held_first  # type: ignore[method-assign,assignment]
    errors: dict[str, BaseException] = {}

    def submit(device: str, job: str) -> None:
        now = datetime.now(UTC)
        row = {
            "id": str(uuid.uuid4()),
            "state": "active",
            "job_id": job,
            "owner": None,
            "idempotency_key": None,
            "request": "{}",
            "placement": "{}",
            "created_at": now,
            "expires_at": None,
            "ended_at": None,
            "live": True,
            "anchor_node": "n0",
            "anchor_device": device,
        }
        try:
            committer.commit(row, [("n0", device, "gpu")], ["n0"])
        except BaseException as exc:
            errors[device] = exc

    threads = [threading.Thread(target=submit, args=("GPU-first", "first"))]
    threads[0].start()
    assert entered.wait(10)
    for i in range(8):
        threads.append(
            threading.Thread(target=submit, args=(f"GPU-{i}", "bad\x00job" if i == 3 else "good"))
        )
        threads[-1].start()
    while committer._queue.qsize() < 8:
        pass
    gate.set()
    for t in threads:
        t.join(10)
    committer.stop()
    assert list(errors) == ["GPU-3"] and isinstance(errors["GPU-3"], DataError)
    with engine.connect() as conn:
        devices = set(conn.execute(sa.select(schema.gpu_holds.c.device)).scalars())
    engine.dispose()
    assert devices == {"GPU-first"} | {f"GPU-{i}" for i in range(8) if i != 3}


def test_a_failed_commit_leaves_no_tentative_choice(
    database_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = create_app(
        Settings(database_url=database_url, heartbeat_ttl_s=3600), clock=clock, background=False
    )
    with TestClient(app) as client:
        add_nodes(client, ("hgx-h100", "h0"))
        state: ServiceState = app.state.service

        async def refused(*_: object) -> None:
            raise DataError("INSERT", {}, ValueError("a value the database refuses"))

        monkeypatch.setattr(state.committer, "commit_async", refused)
        failed = client.post("/v1/place", json={"gpus": 8})
        assert failed.status_code == 500 and failed.json()["error"]["code"] == "internal_error"
        monkeypatch.undo()
        with state.lock:
            assert state.cluster.node("h0").free_mask == 0xFF and not state.inflight
        assert client.post("/v1/place", json={"gpus": 8}).status_code == 201


@pytest.mark.parametrize("verb", ["confirm", "extend"])
def test_a_guard_that_saw_the_ttl_passed_while_another_replica_extended_it(
    client: TestClient,
    database_url: str,
    settings: Settings,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    verb: str,
) -> None:
    """This replica's clock says the TTL passed; another replica's, a moment earlier,
    extended the reservation between this one's guarded statement and its read of the
    row (Postgres, READ COMMITTED: each statement sees what committed before it). The
    reservation is not expired: the transition is tried again on the row as it is."""
    if database_url.startswith("sqlite"):
        pytest.skip("one writer: nothing commits between a transaction's two statements")
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    placed = api.place(state, PlaceRequest(gpus=1, ttl_s=10), None).allocation
    other_clock = FakeClock()
    other_clock.advance(9)  # the other replica: before the TTL
    clock.advance(11)  # this one: after it
    other = create_app(secured(settings), clock=other_clock, background=False)
    real_by_id = repository.by_id
    extended: list[str] = []

    def by_id(conn: sa.Connection, allocation_id: str) -> sa.RowMapping | None:
        if not extended:
            extended.append(api.extend(other.state.service, allocation_id, 60).id)
        return real_by_id(conn, allocation_id)

    with TestClient(other):
        monkeypatch.setattr(repository, "by_id", by_id)
        if verb == "confirm":
            answer = api.confirm(state, placed.id)
        else:
            answer = api.extend(state, placed.id, 30)
    assert extended == [placed.id]
    assert answer.state == ("active" if verb == "confirm" else "pending"), answer
    with state.engine.connect() as conn:
        row = real_by_id(conn, placed.id)
    assert row is not None and row["state"] == answer.state and row["live"]


def test_a_job_said_to_run_on_a_mig_gpu_whole_supersedes_its_instances(
    client: TestClient,
) -> None:
    """A scheduler's truth naming a GPU in MIG mode by its index holds the GPU whole: a
    reservation holding one of its MIG instances is superseded, as a truth of instances
    supersedes a holder of their parent GPU whole (``mig_truth``). Kept, the one GPU was
    in two live allocations: the whole GPU's and the instance's, each job told it runs
    there."""
    snap = add_nodes(client, ("hgx-h100-mig", "m0"))[0]
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    placed = client.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb"})
    assert placed.status_code == 201, placed.text
    [instance] = placed.json()["tasks"][0]["mig_uuids"]
    parent = next(m.parent_gpu for m in snap.mig_instances if m.uuid == instance)

    seen = api.observe(state, "J", "alice", {"m0": [parent]}, [], "slurm prolog", started=True)

    assert seen.action == "created" and seen.superseded == (placed.json()["id"],), seen
    assert client.get(f"/v1/allocations/{placed.json()['id']}").json()["state"] == "released"
    engine: sa.Engine = state.engine
    with engine.connect() as conn:
        held = conn.execute(sa.select(schema.gpu_holds.c.device, schema.gpu_holds.c.kind)).all()
    assert [tuple(h) for h in held] == [(snap.gpus[parent].uuid, "gpu")]


def test_a_gang_task_said_to_run_on_a_mig_gpu_whole_supersedes_its_instances(
    client: TestClient,
) -> None:
    """The same for one task of a gang (``task_truth``, the kubelet's report of a member):
    moved onto a GPU in MIG mode, it holds the GPU whole and the holder of one of its
    instances is stale."""
    snap = add_nodes(client, ("dgx-a100-mig", "a0"))[0]
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    gang = api.place(state, PlaceRequest(gpus=1, tasks=2, job_id="gang"), None).allocation
    placed = client.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb"})
    assert placed.status_code == 201, placed.text
    [instance] = placed.json()["tasks"][0]["mig_uuids"]
    parent = next(m.parent_gpu for m in snap.mig_instances if m.uuid == instance)
    moved = api.task_truth(state, gang.id, 0, "a0", [parent], "the kubelet", job_id="gang")

    (seen,) = api.observe_all(state, [moved])

    assert seen == Observation("moved", gang.id, (placed.json()["id"],)), seen
    assert client.get(f"/v1/allocations/{placed.json()['id']}").json()["state"] == "released"
    with state.engine.connect() as conn:
        held = set(conn.execute(sa.select(schema.gpu_holds.c.device)).scalars())
    assert instance not in held and snap.gpus[parent].uuid in held


@pytest.mark.parametrize("moved", [False, True], ids=["matched", "moved"])
def test_a_reservation_its_job_runs_on_never_expires_under_it(
    client: TestClient, clock: FakeClock, moved: bool
) -> None:
    """A REST reservation pinned to a scheduler's job (named in its admin comment): the
    scheduler then says the job runs, on those GPUs or others. The job holds them until
    it ends, so the reservation loses its TTL. Left pending, it expired under the running
    job and the next /place was given the GPUs it runs on."""
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    held = client.post("/v1/place", json={"gpus": 2, "ttl_s": 30}).json()
    indices = held["tasks"][0]["gpu_indices"]
    runs_on = [i for i in range(8) if i not in indices][:2] if moved else indices

    seen = api.observe(state, "J", "alice", {"h0": runs_on}, [held["id"]], "prolog", True)

    assert seen.action == ("moved" if moved else "attached") and seen.allocation_id == held["id"]
    now = client.get(f"/v1/allocations/{held['id']}").json()
    assert now["state"] == "active" and now["expires_at"] is None
    clock.advance(60)
    client.post("/v1/nodes/h0/heartbeat")
    assert api.sweep(state).ids == ()
    kept = client.get(f"/v1/allocations/{held['id']}").json()
    assert kept["state"] == "active" and sorted(kept["tasks"][0]["gpu_indices"]) == runs_on
    assert len(client.get("/v1/nodes/h0").json()["free_gpus"]) == 6
    # The confirmation is in the audit trail, as a confirm's is.
    trail = client.get("/v1/audit", params={"allocation_id": held["id"]}).json()["entries"]
    assert "confirmed" in [e["action"] for e in trail]


class _RevokedSince:
    """A token check that has heard of one revocation since the request was let in: the
    request's own token."""

    generation = 1

    def revoked_id(self, token_id: str) -> bool:
        return token_id == "revoked-token"


def test_touch_by_a_request_whose_token_was_revoked_stamps_nothing(
    client: TestClient, clock: FakeClock
) -> None:
    """A touch keeps a reservation from the reconciler's release (a retried bind, a gang's
    next member): a request whose token was revoked while it waited must not."""
    add_nodes(client, ("hgx-h100", "h0"))
    placed = client.post("/v1/place", json={"gpus": 2}).json()
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]

    def touched_at() -> object:
        with state.engine.connect() as conn:
            row = conn.execute(
                sa.select(schema.allocations.c.touched_at).where(
                    schema.allocations.c.id == placed["id"]
                )
            )
            return row.scalar_one()

    before = touched_at()
    clock.advance(5)
    admission = revoked_meanwhile.Admission(_RevokedSince(), "revoked-token", 0)
    with revoked_meanwhile.admitted(admission), pytest.raises(Unauthorized):
        api.touch(state, placed["id"])
    assert touched_at() == before
    assert api.touch(state, placed["id"]) is not None  # a request with no token check: done
    assert touched_at() != before


def test_a_truth_whose_reservation_expires_as_it_runs_holds_the_gpus(
    client: TestClient, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler says a job runs on its reservation's GPUs just as the reservation's
    TTL passes: the sweep (here or on another replica) commits the expiry after the
    truth read the job's holds and before it took the TTL away. The truth then found
    nothing to confirm and answered ``matched``, and the GPUs the job runs on were
    left free for the next /place."""
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    held = client.post("/v1/place", json={"gpus": 2, "ttl_s": 30}).json()
    indices = held["tasks"][0]["gpu_indices"]
    clock.advance(30)
    client.post("/v1/nodes/h0/heartbeat")
    real_run = repository.run
    swept: list[tuple[str, ...]] = []

    def run_after_the_sweep(conn: sa.Connection, allocation_id: str, now: datetime) -> object:
        if not swept:  # the sweep's transaction, on a connection of its own, commits first
            swept.append(api.sweep(state).ids)
        return real_run(conn, allocation_id, now)

    monkeypatch.setattr(repository, "run", run_after_the_sweep)

    seen = api.observe(state, "J", "alice", {"h0": indices}, [held["id"]], "kubelet")

    assert swept == [(held["id"],)]
    assert seen.action == "created", seen
    now = client.get(f"/v1/allocations/{seen.allocation_id}").json()
    assert now["state"] == "active" and now["job_id"] == "J"
    assert sorted(now["tasks"][0]["gpu_indices"]) == sorted(indices)
    assert _holds(client) == 2 and _free(client, "h0") == 6


def test_a_start_report_met_by_a_release_from_an_older_view_holds_the_gpus(
    client: TestClient, database_url: str, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Slurm reconcile decided from an answer read before the job started (it saw the
    job held) releases the job's allocation, quiet from that answer's moment; the
    prolog's report of the start, which stamps the allocation so that such a release
    leaves it, read the job's holds just before the release committed and stamped
    after. The stamp found nothing live, the report answered ``matched``, and the GPUs
    the job runs on were free for the next /place. (SQLite: the report holds the one
    write lock from its first statement, so no release commits inside it.)"""
    if database_url.startswith("sqlite"):
        pytest.skip("one writer: nothing commits between a transaction's two statements")
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    held = api.place(state, PlaceRequest(gpus=2, job_id="7"), None, active=True).allocation
    indices = list(held.tasks[0].gpu_indices)
    seen_held_at = clock()  # the reconcile's squeue answer: job 7 held
    clock.advance(5)
    real_touch = repository.touch
    released: list[tuple[str, ...]] = []

    def touch_after_the_release(
        conn: sa.Connection, allocation_id: str, now: datetime
    ) -> sa.RowMapping | None:
        if not released:  # the reconcile's release, on a connection of its own, commits first
            released.append(api.release(state, allocation_id, quiet=seen_held_at).ids)
        return real_touch(conn, allocation_id, now)

    monkeypatch.setattr(repository, "touch", touch_after_the_release)

    seen = api.observe(state, "7", "slurm:alice", {"h0": indices}, [], "prolog", True, touch=True)

    assert released == [(held.id,)]
    assert seen.action == "created", seen
    now = client.get(f"/v1/allocations/{seen.allocation_id}").json()
    assert now["state"] == "active" and now["job_id"] == "7"
    assert sorted(now["tasks"][0]["gpu_indices"]) == sorted(indices)
    assert _holds(client) == 2 and _free(client, "h0") == 6


@pytest.mark.parametrize("moves", [True, False], ids=["moved", "where-given"])
def test_a_gang_reservation_a_member_is_reported_on_never_expires_under_it(
    client: TestClient, clock: FakeClock, moves: bool
) -> None:
    """A gang's reservation still pending (the first member's confirm failed after its
    Binding): the kubelet's report of a member gave it other GPUs, and its task moved
    there, or the very GPUs its task was given, and nothing moved. The member runs, so
    the reservation loses its TTL either way, as a job's reservation a scheduler's truth
    matches or moves does. Left pending (after a move; and answered ``matched``), the
    sweep ended it under the running members at its TTL, all 4 GPUs free for the next
    /place."""
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    request = PlaceRequest(gpus=2, tasks=2, job_id="gang", ttl_s=30)
    gang = api.place(state, request, None).allocation
    held = {g for t in gang.tasks for g in t.gpu_indices}
    given = sorted(gang.tasks[0].gpu_indices)
    runs_on = [g for g in range(8) if g not in held][:2] if moves else given
    report = api.task_truth(state, gang.id, 0, "h0", runs_on, "the kubelet", job_id="gang")

    (seen,) = api.observe_all(state, [report])

    assert seen == Observation("moved" if moves else "matched", gang.id), seen
    clock.advance(60)
    client.post("/v1/nodes/h0/heartbeat")
    assert api.sweep(state).ids == ()
    kept = client.get(f"/v1/allocations/{gang.id}").json()
    assert kept["state"] == "active" and kept["expires_at"] is None
    assert sorted(kept["tasks"][0]["gpu_indices"]) == runs_on
    assert _holds(client) == 4 and _free(client, "h0") == 4
