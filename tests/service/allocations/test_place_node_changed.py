"""A reservation commits only on the node snapshot it was chosen on.

A snapshot report that drops or breaks a GPU may commit between a /place's choice
(in memory) and its commit: on this replica while the commit waits, or on another
replica whose memory has not caught up yet. The commit must then fail and the
request be decided again on the new snapshot, never hold the GPU that went.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from placement import Health, NodeSnapshot
from service import schema
from service.allocations import api
from service.allocations.place_flow import Commit, Flow, Step, blocking_step
from service.allocations.results import Placed
from service.allocations.schemas import PlaceRequest
from service.app import create_app
from service.errors import Unschedulable
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock, secured
from tests.service.helpers import add_nodes, report

ONE_GPU = PlaceRequest.model_validate({"gpus": 1, "job_id": "one"})
HALF_GPU = PlaceRequest.model_validate({"gpu_fraction": 0.5, "job_id": "half"})


def _state(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def _up_to_commit(state: ServiceState, flow: Flow[Placed]) -> Commit:
    step = next(flow)
    while not isinstance(step, Commit):
        step = flow.send(blocking_step(state, False, step))
    return step


def _finish(state: ServiceState, flow: Flow[Placed], step: Step) -> Placed:
    """The rest of a flow from ``step`` on, each step's error thrown in (flows.drive)."""
    try:
        while True:
            try:
                result = blocking_step(state, False, step)
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(result)
    except StopIteration as done:
        placed: Placed = done.value
        return placed


def _broken(snap: NodeSnapshot, seq: int, uuids: set[str]) -> NodeSnapshot:
    gpus = [
        g.model_copy(update={"health": Health.UNHEALTHY}) if g.uuid in uuids else g
        for g in snap.gpus
    ]
    return snap.model_copy(update={"seq": seq, "gpus": gpus})


def _held(state: ServiceState) -> dict[str, str]:
    """device -> the allocation holding it (whole, or a share of it), as the database has it."""
    held = schema.holdings()
    with state.engine.connect() as conn:
        rows = conn.execute(sa.select(held.c.device, held.c.allocation_id)).all()
    return {str(device): str(allocation) for device, allocation in rows}


@pytest.mark.parametrize("body", [ONE_GPU, HALF_GPU], ids=["whole", "share"])
def test_a_gpu_broken_between_choice_and_commit_is_never_held(
    client: TestClient, body: PlaceRequest
) -> None:
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    state = _state(client)
    flow = api.placing(state, body, "k-1")
    step = _up_to_commit(state, flow)
    chosen = {device for _, device, kind in step.holds if kind == "gpu"}
    chosen |= {device for _, device, _ in step.shares}
    # The node's agent reports the chosen GPU unhealthy while the commit waits.
    answer = report(client, _broken(snap, snap.seq + 1, chosen))
    assert answer.status_code == 200, answer.text
    placed = _finish(state, flow, step)
    assert placed.created
    got = {g for t in placed.allocation.tasks for g in t.gpu_uuids}
    assert got and not got & chosen, (got, chosen)
    assert set(_held(state)) == got
    assert placed.allocation.state == "pending"
    # The same key again is that one reservation, never a second set of GPUs.
    again = api.place(state, body, "k-1")
    assert (again.created, again.allocation.id) == (False, placed.allocation.id)
    assert set(_held(state)) == got


def test_a_replica_behind_a_snapshot_never_places_on_its_broken_gpus(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    (snap,) = add_nodes(client, ("hgx-h100", "h0"))
    app = create_app(secured(settings), clock=clock, background=False)
    with TestClient(app):
        behind: ServiceState = app.state.service
        assert behind.cluster.node("h0").snapshot.seq == snap.seq
        every = {g.uuid for g in snap.gpus}
        answer = report(client, _broken(snap, snap.seq + 1, every))  # through the first replica
        assert answer.status_code == 200, answer.text
        # The second replica still has every GPU healthy in memory; the database says
        # none is: the request is decided again on the stored snapshot, and nothing fits.
        with pytest.raises(Unschedulable):
            api.place(behind, ONE_GPU, "k-2")
        assert _held(behind) == {}
        assert behind.cluster.node("h0").snapshot.seq == snap.seq + 1
