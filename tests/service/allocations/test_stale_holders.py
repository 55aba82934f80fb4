"""Which holders of devices a truth takes end whole, which give up only those, and which
a node's own report may not end (service/allocations/stale_holders.py)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.allocations import api, repository, stale_holders
from service.allocations.schemas import PlaceRequest
from service.state import ServiceState
from tests.service.helpers import add_nodes

GANG = ("k8s-gang:",)


def _state(client: TestClient) -> ServiceState:
    add_nodes(client, ("hgx-h100", "h0"), ("hgx-h100", "h1"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def _taken(state: ServiceState, allocation_id: str, count: int) -> dict[str, list[str]]:
    """``count`` of the allocation's GPU holds, as ``repository.holders`` names them."""
    with state.engine.connect() as conn:
        holds = [(n, d) for n, d, k in repository.holds_with_kind(conn, allocation_id)]
        return repository.holders(conn, sorted(holds)[:count])


def test_an_allocation_over_two_nodes_ends_whole_and_reaches_beyond_one(
    client: TestClient,
) -> None:
    state = _state(client)
    wide = api.place(state, PlaceRequest(gpus=8, tasks=2, job_id="wide"), None).allocation
    assert {t.node for t in wide.tasks} == {"h0", "h1"}
    stale = {
        a: [d for d in ds if d.startswith("h0/")] for a, ds in _taken(state, wide.id, 16).items()
    }
    with state.engine.connect() as conn:
        found = stale_holders.split(conn, stale, GANG)
        assert found.whole == [wide.id] and found.partial == {}
        assert stale_holders.beyond(conn, found, ["h0"]) == [wide.id]
        assert stale_holders.beyond(conn, found, ["h0", "h1"]) == []


def test_a_gangs_reservation_gives_up_only_the_devices_taken(client: TestClient) -> None:
    """And stays live, anchored on a hold it keeps: where the devices given up held its
    anchor, the deferred foreign key failed the report's whole transaction at commit
    (IntegrityError), and none of the report's pods was recorded."""
    state = _state(client)
    request = PlaceRequest(gpus=2, tasks=2, job_id="g", owner="k8s-gang:ml/g", nodes=["h0"])
    gang = api.place(state, request, None).allocation
    some, every = _taken(state, gang.id, 2), _taken(state, gang.id, 4)
    with state.engine.begin() as conn:
        assert stale_holders.split(conn, some, ()).whole == [gang.id]  # not a gang's truth
        assert stale_holders.split(conn, every, GANG).whole == [gang.id]  # nothing left
        found = stale_holders.split(conn, some, GANG)
        assert found.whole == [] and list(found.partial) == [gang.id]
        assert stale_holders.beyond(conn, found, ["h1"]) == []  # none ends whole
        ended, freed = stale_holders.end(conn, found, state.clock())
        assert ended == [] and len(freed) == 2
        assert len(repository.holds_with_kind(conn, gang.id)) == 2
        row = repository.by_id(conn, gang.id)
        assert row is not None and row["state"] in repository.LIVE
