"""A GPU held whole and one of its MIG instances held, by two replicas at once.

A whole GPU's hold and an instance's hold name different devices (the GPU's UUID,
the instance's), so the database let both commit: a scheduler's truth that a job
runs on a MIG-mode GPU whole, stored through one replica, and a reservation of one
of its instances, chosen by a replica that had not heard of the truth. The GPU was
in two live allocations. An instance's hold now also counts in its GPU's MIG pool
(a ``gpu_holds`` row of kind ``migpool`` keyed by the GPU's UUID), which a whole
GPU's hold cannot share a key with: the second to commit fails.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import NodeSnapshot
from service import schema
from service.allocations import api, repository
from service.allocations.results import Observation
from service.allocations.schemas import PlaceRequest
from service.app import create_app
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes, report

NODE = "m0"


@contextlib.contextmanager
def _replica(settings: Settings, clock: FakeClock) -> Iterator[TestClient]:
    """A second replica on the same database, without a background loop: it hears of
    no other replica's change."""
    with TestClient(create_app(settings, clock=clock, background=False)) as client:
        yield client


def _state(client: TestClient) -> ServiceState:
    return client.app.state.service  # type: ignore[attr-defined,no-any-return]


def _rows(state: ServiceState) -> list[tuple[str, str, str | None, int | None]]:
    h = schema.gpu_holds
    with state.engine.connect() as conn:
        query = sa.select(h.c.device, h.c.kind, h.c.parent, h.c.instances).order_by(h.c.device)
        return [tuple(r) for r in conn.execute(query)]  # type: ignore[misc]


def _live_holders(state: ServiceState, snap: NodeSnapshot) -> dict[str, set[str]]:
    """GPU UUID -> the live allocations holding it whole or holding one of its instances."""
    parent_of = {m.uuid: snap.gpus[m.parent_gpu].uuid for m in snap.mig_instances}
    h = schema.gpu_holds
    found: dict[str, set[str]] = {}
    with state.engine.connect() as conn:
        rows = conn.execute(
            sa.select(h.c.device, h.c.allocation_id).where(h.c.allocation_id.is_not(None))
        )
        for device, allocation_id in rows:
            gpu = parent_of.get(str(device), str(device))
            found.setdefault(gpu, set()).add(str(allocation_id))
    return found


def test_an_instance_of_a_gpu_a_truth_holds_whole_is_refused_on_a_replica_behind(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    (snap,) = add_nodes(client, ("hgx-h100-mig", NODE))
    with _replica(settings, clock) as behind:
        every_gpu = list(range(len(snap.gpus)))
        seen = api.observe(
            _state(client), "J", "alice", {NODE: every_gpu}, [], "slurm prolog", started=True
        )
        assert seen.action == "created", seen

        placed = behind.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb"})

        assert placed.status_code == 409, placed.text
        assert placed.json()["error"]["code"] == "unschedulable"
        holders = _live_holders(_state(client), snap)
        assert all(len(ids) == 1 for ids in holders.values()), holders


def test_the_pool_counts_the_instances_held_and_goes_with_the_last(client: TestClient) -> None:
    (snap,) = add_nodes(client, ("hgx-h100-mig", NODE))
    state = _state(client)
    placed = [
        client.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb", "ttl_s": 600})
        for _ in range(3)
    ]
    assert all(p.status_code == 201 for p in placed), [p.text for p in placed]
    parents = {
        snap.gpus[m.parent_gpu].uuid
        for p in placed
        for m in snap.mig_instances
        if m.uuid in p.json()["tasks"][0]["mig_uuids"]
    }
    rows = _rows(state)
    pools = {d: n for d, k, _, n in rows if k == "migpool"}
    assert set(pools) == parents and sum(pools.values()) == 3, rows
    assert all(p in parents for d, k, p, _ in rows if k == "mig"), rows

    for p in placed:
        assert client.post(f"/v1/allocations/{p.json()['id']}/release").status_code == 200

    assert _rows(state) == []


def test_a_whole_hold_and_an_instance_pool_of_one_gpu_never_commit_together(
    client: TestClient,
) -> None:
    """The truth's write racing the instance's, in either order, at the database."""
    (snap,) = add_nodes(client, ("hgx-h100-mig", NODE))
    state = _state(client)
    placed = client.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb", "ttl_s": 600})
    assert placed.status_code == 201, placed.text
    [instance] = placed.json()["tasks"][0]["mig_uuids"]
    parent = next(snap.gpus[m.parent_gpu].uuid for m in snap.mig_instances if m.uuid == instance)
    now = datetime.now(UTC)
    row = {
        "id": "whole",
        "state": "active",
        "request": "{}",
        "placement": "{}",
        "created_at": now,
        "live": True,
        "anchor_node": NODE,
        "anchor_device": parent,
    }

    with pytest.raises(sa.exc.IntegrityError), state.engine.begin() as conn:
        repository.insert(conn, row, [(NODE, parent, "gpu")])

    assert _live_holders(state, snap)[parent] == {placed.json()["id"]}


def test_a_truth_whose_read_came_before_an_instance_reservation_supersedes_it(
    client: TestClient,
    database_url: str,
    settings: Settings,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other order: the truth read the holders of its GPUs (none), then another
    replica's reservation of an instance committed, then the truth wrote its whole-GPU
    holds. The write meets the instance's pool and fails; tried again, the truth finds
    the reservation holding an instance of its GPU and supersedes it."""
    if database_url.startswith("sqlite"):
        pytest.skip("one writer: nothing commits between a transaction's two statements")
    (snap,) = add_nodes(client, ("hgx-h100-mig", NODE))
    state = _state(client)
    with _replica(settings, clock) as behind:
        real_holders = repository.holders
        raced: list[str] = []

        def holders(conn: sa.Connection, devices: list[tuple[str, str]]) -> dict[str, list[str]]:
            found = real_holders(conn, devices)
            if not raced:
                placed = behind.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb"})
                assert placed.status_code == 201, placed.text
                raced.append(placed.json()["id"])
            return found

        monkeypatch.setattr(repository, "holders", holders)
        every_gpu = list(range(len(snap.gpus)))
        seen = api.observe(state, "J", "alice", {NODE: every_gpu}, [], "slurm prolog", started=True)

    assert seen.action == "created" and seen.superseded == tuple(raced), seen
    assert client.get(f"/v1/allocations/{raced[0]}").json()["state"] == "released"
    holders_now = _live_holders(state, snap)
    assert all(len(ids) == 1 for ids in holders_now.values()), holders_now
    assert {d: k for d, k, _, _ in _rows(state)} == {g.uuid: "gpu" for g in snap.gpus}


def test_a_truth_on_a_gpu_turned_mig_off_supersedes_its_instances_still_held(
    client: TestClient,
) -> None:
    """MIG turned off under a held instance: its allocation is degraded and keeps the
    hold (the job may still run), and the GPU's pool stays. A scheduler then says a job
    runs on the GPU whole: the truth wins, and the instance's holder, found by its hold's
    GPU (the snapshot lists the instance no more), is superseded. Looked up by the
    snapshot's instances only, it was not found, and the pool refused the truth's
    hold on every try."""
    (snap,) = add_nodes(client, ("hgx-h100-mig", NODE))
    state = _state(client)
    placed = client.post("/v1/place", json={"gpus": 1, "mig_profile": "1g.10gb", "ttl_s": 600})
    assert placed.status_code == 201, placed.text
    [instance] = placed.json()["tasks"][0]["mig_uuids"]
    parent = next(m.parent_gpu for m in snap.mig_instances if m.uuid == instance)
    gpus = [
        g.model_copy(update={"mig_enabled": False}) if g.index == parent else g for g in snap.gpus
    ]
    instances = [m for m in snap.mig_instances if m.parent_gpu != parent]
    off = snap.model_copy(update={"seq": snap.seq + 1, "gpus": gpus, "mig_instances": instances})
    assert report(client, off).status_code == 200
    assert client.get(f"/v1/allocations/{placed.json()['id']}").json()["state"] == "degraded"

    seen = api.observe(state, "J", "alice", {NODE: [parent]}, [], "slurm prolog", started=True)

    assert seen.action == "created" and seen.superseded == (placed.json()["id"],), seen
    assert [(d, k) for d, k, _, _ in _rows(state)] == [(snap.gpus[parent].uuid, "gpu")]


@pytest.mark.parametrize("onto", ["another GPU", "its own GPU"])
def test_a_mig_gang_task_moved_onto_a_gpu_whole_gives_up_its_instance(
    client: TestClient, onto: str
) -> None:
    """A MIG gang's member the kubelet gave a whole GPU instead (``task_truth``): the
    task moves onto it and gives up its instance, whose GPU's pool counts it no more.
    Only the task's whole-GPU holds were given up, so its instance stayed held, with no
    GPU named and in no pool; moved onto the instance's own GPU it was taken as moved
    before (its placement names that GPU) and kept the instance, not the GPU."""
    (snap,) = add_nodes(client, ("hgx-h100-mig", NODE))
    state = _state(client)
    request = PlaceRequest(gpus=1, tasks=2, mig_profile="1g.10gb", job_id="gang")
    gang = api.place(state, request, None).allocation
    first, second = gang.tasks
    parent = first.gpu_indices[0]
    whole = next(g.index for g in snap.gpus if g.index not in (parent, second.gpu_indices[0]))
    target = parent if onto == "its own GPU" else whole
    moved = api.task_truth(state, gang.id, 0, NODE, [target], "the kubelet", job_id="gang")

    (seen,) = api.observe_all(state, [moved])

    assert seen == Observation("moved", gang.id), seen
    assert sorted(_rows(state)) == sorted(
        [
            (snap.gpus[target].uuid, "gpu", None, None),
            (second.mig_uuids[0], "mig", second.gpu_uuids[0], None),
            (second.gpu_uuids[0], "migpool", None, 1),
        ]
    )
