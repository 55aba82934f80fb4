"""GPU shares (gpu_fraction) reserved by the service, on SQLite and Postgres.

A share fills a GPU already shared before opening a whole one, never sits on
a GPU a whole-GPU allocation holds, and a GPU's shares never pass a whole
GPU: in memory, and in the database whichever replica writes (the pool row's
check, service/schema.py). Releases and expiry give the thousandths back; a
restarted service shows the same shares.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from placement import NodeSnapshot
from placement.profiles import build_profile
from service import migrate, schema
from service.allocations import api
from service.allocations.batch_writer import BatchWriter
from service.allocations.schemas import PlaceRequest
from service.app import create_app
from service.db import make_engine
from service.errors import Unschedulable
from service.nodes import service as nodes
from service.nodes.schemas import SnapshotReport
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.helpers import add_nodes, report


def _share(client: TestClient, fraction: float, **extra: Any) -> dict[str, Any]:
    response = client.post("/v1/place", json={"gpu_fraction": fraction, **extra})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


def _pools(engine: sa.Engine) -> dict[tuple[str, str], int]:
    holds = schema.gpu_holds
    query = sa.select(holds.c.node, holds.c.device, holds.c.share_milli).where(
        holds.c.kind == "shared"
    )
    with engine.connect() as conn:
        return {(str(n), str(d)): int(m) for n, d, m in conn.execute(query)}


def _shares(engine: sa.Engine) -> dict[str, int]:
    shares = schema.gpu_shares
    with engine.connect() as conn:
        rows = conn.execute(sa.select(shares.c.allocation_id, shares.c.milli))
        return {str(a): int(m) for a, m in rows}


def _state(client: TestClient) -> ServiceState:
    return client.app.state.service  # type: ignore[attr-defined,no-any-return]


def _engine(client: TestClient) -> sa.Engine:
    return _state(client).engine


def test_four_quarters_fill_one_gpu_before_a_fifth_opens_another(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    placed = [_share(client, 0.25, job_id=f"q{i}") for i in range(4)]
    gpus = {(a["tasks"][0]["node"], a["tasks"][0]["gpu_uuids"][0]) for a in placed}
    assert len(gpus) == 1
    (gpu,) = gpus
    task = placed[0]["tasks"][0]
    assert task["gpu_fraction"] == 0.25 and task["env"]["CUDA_VISIBLE_DEVICES"] == gpu[1]
    fifth_allocation = _share(client, 0.25)
    fifth, fifth_id = fifth_allocation["tasks"][0], fifth_allocation["id"]
    assert (fifth["node"], fifth["gpu_uuids"][0]) != gpu
    assert _pools(_engine(client)) == {gpu: 1000, (fifth["node"], fifth["gpu_uuids"][0]): 250}
    assert sorted(_shares(_engine(client)).values()) == [250] * 5
    view = client.get("/v1/cluster").json()["gpus"]
    assert view["shared"] == 2 and view["share_free_milli"] == 750 and view["free"] == 6
    got = client.get(f"/v1/allocations/{placed[1]['id']}").json()
    assert got["tasks"][0]["gpu_fraction"] == 0.25
    node = client.get("/v1/nodes/dgx0").json()
    shared = {g["uuid"]: g["share_milli"] for g in node["gpus"] if g["share_milli"]}
    assert shared == {gpu[1]: 1000, fifth["gpu_uuids"][0]: 250}
    assert not any(g["free"] for g in node["gpus"] if g["uuid"] in shared)
    assert set(node["allocations"]) == {a["id"] for a in placed} | {fifth_id}


def test_whole_gpu_jobs_never_take_a_shared_gpu(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    shared = _share(client, 0.5)["tasks"][0]["gpu_uuids"][0]
    whole = client.post("/v1/place", json={"gpus": 7}).json()
    assert shared not in whole["tasks"][0]["gpu_uuids"]
    refused = client.post("/v1/place", json={"gpus": 1})
    assert refused.status_code == 409, refused.text  # the only GPU left is shared
    assert _share(client, 0.5)["tasks"][0]["gpu_uuids"][0] == shared  # it fills up
    assert client.post("/v1/place", json={"gpu_fraction": 0.1}).status_code == 409


def test_releases_give_the_thousandths_back_and_the_last_frees_the_gpu(
    client: TestClient,
) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    first, second = _share(client, 0.3), _share(client, 0.6)
    gpu = ("dgx0", first["tasks"][0]["gpu_uuids"][0])
    assert _pools(_engine(client)) == {gpu: 900}
    released = client.post(f"/v1/allocations/{first['id']}/release").json()
    assert released["released"] == [first["id"]]
    assert _pools(_engine(client)) == {gpu: 600}
    again = client.post(f"/v1/allocations/{first['id']}/release").json()
    assert again["released"] == [] and _pools(_engine(client)) == {gpu: 600}
    client.post(f"/v1/allocations/{second['id']}/release")
    assert _pools(_engine(client)) == {} and _shares(_engine(client)) == {}
    view = client.get("/v1/cluster").json()["gpus"]
    assert view["free"] == 8 and view["shared"] == 0
    assert client.post("/v1/place", json={"gpus": 8}).status_code == 201


def test_a_retried_share_is_the_same_share(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    key = {"Idempotency-Key": "share-retry-1"}
    first = client.post("/v1/place", json={"gpu_fraction": 0.4}, headers=key).json()
    again = client.post("/v1/place", json={"gpu_fraction": 0.4}, headers=key).json()
    assert again["id"] == first["id"]
    assert list(_pools(_engine(client)).values()) == [400]


def test_an_expired_share_is_given_back(settings: Settings, clock: FakeClock) -> None:
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as client:
        add_nodes(client, ("dgx1-v100", "dgx0"))
        share = _share(client, 0.5, ttl_s=60)
        kept = _share(client, 0.25)
        client.post(f"/v1/allocations/{kept['id']}/confirm")
        clock.advance(61)
        assert api.sweep(app.state.service).ids == (share["id"],)
        assert list(_pools(_engine(client)).values()) == [250]
        assert client.get(f"/v1/allocations/{share['id']}").json()["state"] == "expired"


def test_a_restarted_service_shows_the_same_shares(settings: Settings, clock: FakeClock) -> None:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with TestClient(
        create_app(secured(settings), clock=clock, background=False), headers=headers
    ) as c:
        add_nodes(c, ("dgx1-v100", "dgx0"))
        placed = [_share(c, f) for f in (0.5, 0.25, 0.7)]
        before = c.get("/v1/cluster").json()["gpus"]
    with TestClient(
        create_app(secured(settings), clock=clock, background=False), headers=headers
    ) as c:
        assert c.get("/v1/cluster").json()["gpus"] == before
        assert before["shared"] == 2 and before["share_free_milli"] == 550
        # The 0.25 fits beside the 0.5 (the tightest shared GPU), as before the restart.
        next_share = _share(c, 0.25)["tasks"][0]["gpu_uuids"][0]
        assert next_share == placed[0]["tasks"][0]["gpu_uuids"][0]


def test_score_refuses_a_share_with_what_to_call(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    response = client.post("/v1/score", json={"gpu_fraction": 0.25})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "unsupported" and error["detail"] == {"field": "gpu_fraction"}
    assert "POST /v1/place" in error["message"]
    bad = client.post("/v1/place", json={"gpu_fraction": 0.5, "gpus": 2})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_request"
    assert _pools(_engine(client)) == {}


# ---- what the database itself refuses, whichever replica writes --------------------


@pytest.fixture
def replicas(database_url: str) -> Iterator[tuple[ServiceState, ServiceState]]:
    migrate.upgrade(database_url)
    made = []
    for _ in range(2):
        settings = Settings(database_url=database_url, heartbeat_ttl_s=3600)
        state = ServiceState(settings, make_engine(database_url))
        state.load()
        made.append(state)
    a, b = made
    nodes.report_snapshot(a, "dgx0", SnapshotReport(snapshot=build_profile("dgx1-v100", "dgx0")))
    b.sync_nodes(None)
    yield a, b
    for state in made:
        state.committer.stop()
        state.engine.dispose()


def test_two_replicas_never_put_more_than_a_gpu_of_shares_on_one(
    replicas: tuple[ServiceState, ServiceState],
) -> None:
    """B has not heard of A's share: it chooses the same GPU, the pool's check refuses
    the commit, and B learns A's share and takes another GPU."""
    a, b = replicas
    first = api.place(a, PlaceRequest(gpu_fraction=0.75), None).allocation.tasks[0]
    second = api.place(b, PlaceRequest(gpu_fraction=0.5), None).allocation.tasks[0]
    assert second.gpu_uuids != first.gpu_uuids
    pools = _pools(a.engine)
    assert pools == {("dgx0", first.gpu_uuids[0]): 750, ("dgx0", second.gpu_uuids[0]): 500}
    assert b.cluster.node("dgx0").shares[first.gpu_uuids[0]] == 750  # learnt on the retry


def test_a_replica_never_shares_a_gpu_the_other_holds_whole(
    replicas: tuple[ServiceState, ServiceState],
) -> None:
    a, b = replicas
    whole = api.place(a, PlaceRequest(gpus=1), None).allocation.tasks[0].gpu_uuids[0]
    share = api.place(b, PlaceRequest(gpu_fraction=0.5), None).allocation.tasks[0]
    assert share.gpu_uuids[0] != whole
    with b.engine.connect() as conn:
        kinds = dict(
            conn.execute(sa.select(schema.gpu_holds.c.device, schema.gpu_holds.c.kind)).all()
        )
    assert kinds == {whole: "gpu", share.gpu_uuids[0]: "shared"}


def test_a_whole_gpu_is_never_reserved_on_the_other_replicas_pool(
    replicas: tuple[ServiceState, ServiceState],
) -> None:
    a, b = replicas
    share = api.place(a, PlaceRequest(gpu_fraction=0.5), None).allocation.tasks[0].gpu_uuids[0]
    with pytest.raises(Unschedulable):  # B thought all 8 free; the commit told it otherwise
        api.place(b, PlaceRequest(gpus=8), None)
    seven = api.place(b, PlaceRequest(gpus=7), None).allocation.tasks[0].gpu_uuids
    assert share not in seven


def test_the_pool_check_refuses_a_share_on_a_whole_hold_and_past_a_gpu(
    replicas: tuple[ServiceState, ServiceState],
) -> None:
    a, _ = replicas
    whole = api.place(a, PlaceRequest(gpus=1, job_id="w"), None).allocation
    writer = BatchWriter(a.engine)

    def share_row(allocation: str, device: str, milli: int) -> dict[str, Any]:
        return {"node": "dgx0", "device": device, "allocation_id": allocation, "milli": milli}

    def allocation_row(allocation: str, device: str) -> dict[str, Any]:
        return {
            "id": allocation,
            "state": "active",
            "job_id": None,
            "owner": None,
            "idempotency_key": None,
            "request": "{}",
            "placement": "{}",
            "created_at": a.clock(),
            "expires_at": None,
            "ended_at": None,
            "live": True,
            "anchor_node": None,
            "anchor_device": None,
            "share_node": "dgx0",
            "share_device": device,
        }

    held = whole.tasks[0].gpu_uuids[0]
    with pytest.raises(IntegrityError):
        writer.write([allocation_row("s1", held)], [], [], [], [share_row("s1", held, 100)])
    free = next(g.uuid for g in a.cluster.node("dgx0").snapshot.gpus if g.uuid != held)
    writer.write([allocation_row("s2", free)], [], [], [], [share_row("s2", free, 600)])
    with pytest.raises(IntegrityError):
        writer.write([allocation_row("s3", free)], [], [], [], [share_row("s3", free, 500)])
    assert _pools(a.engine) == {("dgx0", free): 600}
    assert set(_shares(a.engine)) == {"s2"}


def test_a_pool_that_is_not_the_sum_of_its_shares_is_logged_at_load(
    replicas: tuple[ServiceState, ServiceState], caplog: pytest.LogCaptureFixture
) -> None:
    a, _ = replicas
    gpu = api.place(a, PlaceRequest(gpu_fraction=0.25), None).allocation.tasks[0].gpu_uuids[0]
    holds = schema.gpu_holds
    with a.engine.begin() as conn:  # a row changed by hand, behind the service's back
        conn.execute(sa.update(holds).where(holds.c.device == gpu).values(share_milli=400))
    caplog.set_level("ERROR", logger="topoplace.state")
    a.load()
    assert f"GPU {gpu} on dgx0: its share pool counts 400/1000" in caplog.text
    assert "add up to 250/1000" in caplog.text
    assert a.cluster.node("dgx0").shares == {gpu: 400}  # memory follows the pool


def test_racing_replicas_keep_every_pool_the_sum_of_its_shares_and_at_most_a_gpu(
    replicas: tuple[ServiceState, ServiceState],
) -> None:
    """Both replicas place and release shares at once until the node is full: no pool
    passes a GPU, each pool is its shares' sum, and the last release leaves no pool."""
    a, b = replicas
    start = threading.Barrier(2)
    placed: dict[str, list[str]] = {"a": [], "b": []}

    def fill(state: ServiceState, name: str) -> None:
        start.wait()
        for _ in range(40):
            try:
                allocation = api.place(state, PlaceRequest(gpu_fraction=0.3), None).allocation
            except Unschedulable:
                continue
            placed[name].append(allocation.id)

    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(fill, a, "a"), pool.submit(fill, b, "b")]:
            done.result()
    pools = _pools(a.engine)
    by_gpu: dict[str, int] = {}
    shares = schema.gpu_shares
    with a.engine.connect() as conn:
        for device, milli in conn.execute(sa.select(shares.c.device, shares.c.milli)):
            by_gpu[str(device)] = by_gpu.get(str(device), 0) + int(milli)
    assert {d: m for (_, d), m in pools.items()} == by_gpu
    assert all(m <= 1000 for m in pools.values())
    assert len(placed["a"]) + len(placed["b"]) == 8 * 3  # three 0.3 shares a GPU
    start = threading.Barrier(2)

    def empty(state: ServiceState, ids: list[str]) -> None:
        start.wait()
        for allocation_id in ids:
            api.release(state, allocation_id)

    with ThreadPoolExecutor(2) as pool:
        # Each replica releases what the other placed: shares of one GPU end at once.
        for done in [pool.submit(empty, a, placed["b"]), pool.submit(empty, b, placed["a"])]:
            done.result()
    assert _pools(a.engine) == {} and _shares(a.engine) == {}
    for state in (a, b):
        state.sync_nodes(None)
        assert state.cluster.node("dgx0").shares == {}


# As a hostile client sends them, JSON text: NaN and Infinity are what Python's json writes.
# A number in a string is refused as the counts are: "0.5" is a mistake in the caller.
@pytest.mark.parametrize(
    "fraction",
    ["0", "1", "1.5", "-0.25", "NaN", "Infinity", '"quarter"', '"0.5"', "true", "[0.5]"],
)
def test_a_bad_share_is_refused_by_name_and_holds_nothing(
    client: TestClient, fraction: str
) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    response = client.post(
        "/v1/place",
        content=f'{{"gpu_fraction": {fraction}}}',
        headers={"Content-Type": "application/json"},
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "gpu_fraction" in str(error["detail"])
    assert _pools(_engine(client)) == {} and _shares(_engine(client)) == {}
    assert client.get("/v1/cluster").json()["gpus"]["free"] == 8


# A share with what it excludes: the message names the field that clashes, as a caller
# who sent gpus=1 and tasks=1 with a MIG profile was told to send gpus=1, tasks=1.
@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"gpus": 2}, "gpus"),
        ({"tasks": 3}, "tasks"),
        ({"mig_profile": "1g.10gb"}, "mig_profile"),
        ({"tasks": 2, "gpus": 1, "mig_profile": "1g.10gb"}, "mig_profile"),
    ],
)
def test_a_share_with_what_it_excludes_is_refused_naming_it(
    client: TestClient, extra: dict[str, Any], named: str
) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    response = client.post("/v1/place", json={"gpu_fraction": 0.5, **extra})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "gpu_fraction" in error["message"] and named in error["message"], error
    assert _pools(_engine(client)) == {} and _shares(_engine(client)) == {}
    assert client.get("/v1/cluster").json()["gpus"]["free"] == 8


def test_a_null_share_asks_for_one_whole_gpu(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "dgx0"))
    response = client.post("/v1/place", json={"gpu_fraction": None})
    assert response.status_code == 201, response.text
    assert response.json()["tasks"][0]["gpu_fraction"] is None
    assert _pools(_engine(client)) == {}


# ---- a shared GPU gone from a node's report and back -------------------------------
# The database keeps the share (its allocation degraded) and the pool; memory follows
# without a fault, as it does for a whole-GPU hold.


def _without(snap: NodeSnapshot, uuid: str, seq: int) -> NodeSnapshot:
    kept = [g for g in snap.gpus if g.uuid != uuid]
    gpus = [g.model_copy(update={"index": i}) for i, g in enumerate(kept)]
    links = [["X"]] if len(gpus) == 1 else snap.links
    return snap.model_copy(update={"seq": seq, "gpus": gpus, "links": links})


def test_a_snapshot_without_a_shared_gpu_is_taken_without_a_fault(client: TestClient) -> None:
    snap = add_nodes(client, ("workstation-2x-a6000", "ws"))[0]
    share: dict[str, Any] = client.post("/v1/place", json={"gpu_fraction": 0.5}).json()
    gpu = share["tasks"][0]["gpu_uuids"][0]
    response = report(client, _without(snap, gpu, 1))  # the shared GPU is gone
    assert response.status_code == 200, response.text


def test_a_whole_gpu_hold_survives_the_same_reports(client: TestClient) -> None:
    """Control: the same sequence with a whole-GPU hold keeps memory right."""
    snap = add_nodes(client, ("workstation-2x-a6000", "ws"))[0]
    whole: dict[str, Any] = client.post("/v1/place", json={"gpus": 1}).json()
    gpu = whole["tasks"][0]["gpu_uuids"][0]
    for seq in (1, 2):
        assert report(client, _without(snap, gpu, seq)).status_code == 200
    assert report(client, snap.model_copy(update={"seq": 3})).status_code == 200
    assert gpu in _state(client).cluster.node("ws").held_gpus


def test_a_share_is_still_held_in_memory_when_its_gpu_comes_back(client: TestClient) -> None:
    snap = add_nodes(client, ("workstation-2x-a6000", "ws"))[0]
    share: dict[str, Any] = client.post("/v1/place", json={"gpu_fraction": 0.5}).json()
    gpu = share["tasks"][0]["gpu_uuids"][0]
    assert report(client, _without(snap, gpu, 1)).status_code == 200  # gone for two reports
    assert report(client, _without(snap, gpu, 2)).status_code == 200
    assert report(client, snap.model_copy(update={"seq": 3})).status_code == 200  # back
    assert client.get(f"/v1/allocations/{share['id']}").json()["state"] == "degraded"
    assert _pools(_engine(client)) == {("ws", gpu): 500}  # the database still holds it
    memory = dict(_state(client).cluster.node("ws").shares)
    assert memory == {gpu: 500}, f"memory {memory} != database pool {{{gpu!r}: 500}}"


def test_a_restarted_service_keeps_the_shares_of_a_gpu_gone_from_the_report(
    settings: Settings, clock: FakeClock
) -> None:
    """A process started while a shared GPU is off the bus holds its shares by UUID, as
    the process that saw it go does: else every resync found the node changed (memory
    short of the pool), synced it again and told watchers so, every time."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers=headers) as c:
        snap = add_nodes(c, ("workstation-2x-a6000", "ws"))[0]
        gpu = _share(c, 0.5)["tasks"][0]["gpu_uuids"][0]
        assert report(c, _without(snap, gpu, 1)).status_code == 200
        before = dict(_state(c).cluster.node("ws").shares)
        assert before == {gpu: 500} and _state(c).resync() == []
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers=headers) as c:
        assert dict(_state(c).cluster.node("ws").shares) == before
        assert _state(c).resync() == []
        assert report(c, snap.model_copy(update={"seq": 2})).status_code == 200  # back
        assert dict(_state(c).cluster.node("ws").shares) == before
        assert c.get("/v1/cluster").json()["gpus"]["shared"] == 1


def test_a_restarted_service_keeps_a_whole_gpu_gone_from_the_report(
    settings: Settings, clock: FakeClock
) -> None:
    """Control: the same for a GPU held whole, which a process that saw it go holds by
    UUID (the engine keeps holds across snapshots) and one started since did not."""
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers=headers) as c:
        snap = add_nodes(c, ("workstation-2x-a6000", "ws"))[0]
        placed = c.post("/v1/place", json={"gpus": 1})
        assert placed.status_code == 201, placed.text
        gpu = placed.json()["tasks"][0]["gpu_uuids"][0]
        assert report(c, _without(snap, gpu, 1)).status_code == 200
        assert set(_state(c).cluster.node("ws").held_gpus) == {gpu}
        assert _state(c).resync() == []
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app, headers=headers) as c:
        assert set(_state(c).cluster.node("ws").held_gpus) == {gpu}
        assert _state(c).resync() == []
        assert report(c, snap.model_copy(update={"seq": 2})).status_code == 200  # back
        assert c.get("/v1/cluster").json()["gpus"]["free"] == 1


def test_the_other_replica_keeps_serving_the_node(
    replicas: tuple[ServiceState, ServiceState],
) -> None:
    a, b = replicas
    snap = build_profile("workstation-2x-a6000", "ws")
    nodes.report_snapshot(a, "ws", SnapshotReport(snapshot=snap))
    b.sync_nodes(None)
    gpu = (
        api.place(b, PlaceRequest(gpu_fraction=0.5, nodes=["ws"]), None)
        .allocation.tasks[0]
        .gpu_uuids[0]
    )
    nodes.report_snapshot(a, "ws", SnapshotReport(snapshot=_without(snap, gpu, 1)))
    b.sync_nodes(["ws"])  # what B's listener does on A's notification
    assert "ws" in b.cluster, "replica B dropped the node: its stored snapshot 'cannot be loaded'"


# ---- a sync of a node while this process commits a share ----------------------------
# A release's read-back, another replica's notification or a lost race's retry syncs
# the node between the commit and the flow's end of it: a share committed and not yet
# ended here is counted once, and where another replica's commit came first the
# database wins, without a fault.


def _in_thread(work: Callable[[], Any]) -> BaseException | None:
    """``work`` on another thread (another request, the listener); what it raised."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return failure[0] if failure else None


def _around_commit(
    state: ServiceState, before: Callable[[], None] | None, after: Callable[[], None] | None
) -> None:
    """The next commit of ``state`` (only it: a retry commits plainly) with ``before``
    run ahead of the write and ``after`` once it is durable, before the flow ends it."""
    real = state.committer.commit

    def commit(*args: Any, **kwargs: Any) -> None:
        state.committer.commit = real  # type: ignore[method-assign]
        if before is not None:
            before()
        real(*args, **kwargs)
        if after is not None:
            after()

    state.committer.commit = commit  # type: ignore[method-assign]


@pytest.mark.parametrize("quarters_before", [1, 3], ids=["second quarter", "last quarter"])
def test_a_release_right_after_a_share_commits_leaves_memory_as_the_database(
    replicas: tuple[ServiceState, ServiceState], quarters_before: int
) -> None:
    a, _ = replicas
    placed = [api.place(a, PlaceRequest(gpu_fraction=0.25), None) for _ in range(quarters_before)]
    gpu = placed[0].allocation.tasks[0].gpu_uuids[0]
    whole = api.place(a, PlaceRequest(gpus=1), None).allocation  # another GPU of dgx0
    errors: list[BaseException | None] = []
    _around_commit(a, None, lambda: errors.append(_in_thread(lambda: api.release(a, whole.id))))
    last = api.place(a, PlaceRequest(gpu_fraction=0.25), None).allocation
    assert last.tasks[0].gpu_uuids[0] == gpu
    assert errors == [None]
    held = 250 * (quarters_before + 1)
    assert _pools(a.engine) == {("dgx0", gpu): held}
    assert dict(a.cluster.node("dgx0").shares) == {gpu: held}


@pytest.mark.parametrize(
    ("theirs", "ours"),
    [
        ({"gpu_fraction": 0.8}, {"gpu_fraction": 0.25}),
        ({"gpus": 1}, {"gpu_fraction": 0.25}),
        ({"gpu_fraction": 0.25}, {"gpus": 1}),
    ],
    ids=["their share leaves no room", "their whole GPU", "their share on our GPU"],
)
def test_another_replicas_commit_heard_while_ours_commits_does_not_fault_the_sync(
    replicas: tuple[ServiceState, ServiceState], theirs: dict[str, Any], ours: dict[str, Any]
) -> None:
    """B commits on the GPU A is committing on; A's listener syncs the node before A's
    commit is refused. A then places elsewhere, and memory is the database."""
    a, b = replicas
    errors: list[BaseException | None] = []

    def meanwhile() -> None:
        api.place(b, PlaceRequest(**theirs), None)
        errors.append(_in_thread(lambda: a.sync_nodes(["dgx0"])))  # A's listener

    _around_commit(a, meanwhile, None)
    api.place(a, PlaceRequest(**ours), None)
    assert errors == [None]
    b.sync_nodes(["dgx0"])
    assert a.cluster.node("dgx0").shares == b.cluster.node("dgx0").shares
    assert a.cluster.node("dgx0").held_gpus == b.cluster.node("dgx0").held_gpus
