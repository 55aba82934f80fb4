"""A retry with an Idempotency-Key that finds nothing free: its first try is the answer."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.exc import IntegrityError

from service.allocations import api
from service.allocations.place_flow import Commit, Flow, Step, blocking_step
from service.allocations.results import Placed
from service.allocations.schemas import PlaceRequest
from service.app import create_app
from service.errors import KeyInFlight, Unschedulable
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock, secured
from tests.service.helpers import add_nodes

WHOLE_NODE = PlaceRequest.model_validate({"gpus": 8, "job_id": "fills-h0"})


def _state(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def test_a_retry_finding_its_first_try_holding_the_node_replays_it(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state = _state(client)
    first = api.place(state, WHOLE_NODE, "k-1", replay_first=False)
    # The Kubernetes bind's first reservation skips the read before the decision; the
    # engine then finds h0 full of this very reservation's GPUs.
    again = api.place(state, WHOLE_NODE, "k-1", replay_first=False)
    assert (again.created, again.allocation.id) == (False, first.allocation.id)
    with pytest.raises(Unschedulable):
        api.place(state, WHOLE_NODE, "k-2", replay_first=False)  # another key: nothing fits


def test_a_retry_racing_its_first_try_is_told_to_retry_then_replays(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state = _state(client)
    flow = api.placing(state, WHOLE_NODE, "k-1")
    step = next(flow)
    while not isinstance(step, Commit):  # the first try, up to its commit
        step = flow.send(blocking_step(state, False, step))
    with pytest.raises(KeyInFlight) as raced:
        api.place(state, WHOLE_NODE, "k-1")
    assert raced.value.retry_after == 1
    with pytest.raises(StopIteration) as done:
        flow.send(blocking_step(state, False, step))
    first = done.value.value
    assert state.inflight_keys == {}
    again = api.place(state, WHOLE_NODE, "k-1")
    assert (again.created, again.allocation.id) == (False, first.allocation.id)


def test_a_racing_retry_over_http_gets_409_with_retry_after(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state = _state(client)
    flow = api.placing(state, WHOLE_NODE, "k-1")
    step = next(flow)
    while not isinstance(step, Commit):
        step = flow.send(blocking_step(state, False, step))
    body = WHOLE_NODE.model_dump(exclude_unset=True)
    raced = client.post("/v1/place", json=body, headers={"Idempotency-Key": "k-1"})
    assert raced.status_code == 409 and raced.headers["retry-after"] == "1"
    assert raced.json()["error"]["code"] == "idempotency_key_in_flight"
    flow.close()  # the first try abandoned: its GPUs go back, its key is no longer in flight
    assert state.inflight_keys == {}
    placed = client.post("/v1/place", json=body, headers={"Idempotency-Key": "k-1"})
    assert placed.status_code == 201, placed.text


def _committed(state: ServiceState, body: PlaceRequest) -> Flow[Placed]:
    """A flow driven up to its commit, the commit made: the reservation is in the
    database, and the flow has not yet ended its in-flight marks."""
    flow = api.placing(state, body, None)
    step = next(flow)
    while not isinstance(step, Commit):
        step = flow.send(blocking_step(state, False, step))
    blocking_step(state, False, step)
    return flow


@pytest.mark.parametrize(
    "body",
    [WHOLE_NODE, PlaceRequest.model_validate({"gpu_fraction": 0.5, "job_id": "fills-h0"})],
    ids=["whole", "share"],
)
def test_a_reservation_released_before_its_flow_ends_frees_its_gpus_in_memory(
    client: TestClient, body: PlaceRequest
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state = _state(client)
    flow = _committed(state, body)
    # The job's epilog (or another replica) releases it by job id in the moment
    # between the commit and the flow's end: its sync reads h0 from the database.
    assert len(api.release_job(state, "fills-h0").ids) == 1
    with pytest.raises(StopIteration):
        flow.send(None)
    with state.lock:
        node = state.cluster.node("h0")
        assert (node.free_mask, node.shares) == (0xFF, {}), "memory keeps a released GPU busy"
    assert api.place(state, WHOLE_NODE, None).created


def _driven(state: ServiceState, flow: Flow[Placed], step: Step) -> Placed:
    """The rest of a flow, from ``step`` on."""
    while True:
        try:
            step = flow.send(blocking_step(state, False, step))
        except StopIteration as done:
            placed: Placed = done.value
            return placed


def test_a_key_replayed_after_its_commit_lost_keeps_the_winners_gpus_busy(
    client: TestClient, settings: Settings, clock: FakeClock
) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state = _state(client)
    body = PlaceRequest.model_validate({"gpus": 2, "job_id": "j"})
    flow = api.placing(state, body, "k-1")  # this replica: up to its commit
    step = next(flow)
    while not isinstance(step, Commit):
        step = flow.send(blocking_step(state, False, step))
    # The client's retry reached another replica, which chose the same two GPUs and
    # committed first; its notification is applied here before this commit fails.
    other = create_app(secured(settings), clock=clock, background=False)
    with TestClient(other):
        won = api.place(other.state.service, body, "k-1")
    state.sync_nodes(["h0"])
    with pytest.raises(IntegrityError) as lost:
        blocking_step(state, False, step)
    placed = _driven(state, flow, flow.throw(lost.value))  # undone, then the key read
    assert (placed.created, placed.allocation.id) == (False, won.allocation.id)
    held = set(won.allocation.tasks[0].gpu_uuids)
    with state.lock:
        node = state.cluster.node("h0")
        busy = node.held_gpus
    assert busy == held, f"this replica shows {sorted(held - busy)} free, held by the winner"
