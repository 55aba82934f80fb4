"""Gang members bind on the first try, even when filtered while earlier binds are in flight.

kube-scheduler filters pods one at a time but binds them concurrently, and
it leaves out of the next member's candidates the nodes it assumed for the
earlier ones. Each member must be filtered onto exactly its own task's node
of the one plan, or its bind is refused.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_api_server import FakeApiServer
from tests.service.k8s.fixtures import live_app
from tests.waiting import wait_until

NODES = ["h100-a", "h100-b", "h100-c", "h100-d"]
TRIO = {
    "topoplace.io/gang": "trio",
    "topoplace.io/gang-size": "3",
    "topoplace.io/locality": "nvlink",
}


@pytest.fixture
def client(settings: Settings, clock: FakeClock, api: FakeApiServer) -> Iterator[TestClient]:
    with live_app(settings, clock, api, watch=False) as client:
        add_nodes(client, *(("hgx-h100", n) for n in NODES))
        yield client


def _filter(client: TestClient, p: dict[str, Any], names: list[str]) -> list[str]:
    result = client.post("/k8s/v1/filter", json=names_args(p, names)).json()
    passing: list[str] = result["NodeNames"]
    return passing


def _bind_later(
    client: TestClient, p: dict[str, Any], node: str, errors: list[str]
) -> threading.Thread:
    def bind() -> None:
        errors.append(client.post("/k8s/v1/bind", json=binding_args(p, node)).json()["Error"])

    thread = threading.Thread(target=bind)
    thread.start()
    return thread


@pytest.mark.parametrize("size", [3, 12])
def test_members_filtered_during_binds_get_their_own_task(
    settings: Settings, clock: FakeClock, api: FakeApiServer, size: int
):
    nodes = [f"h100-{i:02d}" for i in range(size + 2)]
    notes = {**TRIO, "topoplace.io/gang-size": str(size)}
    with live_app(settings, clock, api, watch=False) as client:
        add_nodes(client, *(("hgx-h100", n) for n in nodes))
        members = [api.add(pod(f"trio-{i}", 8, annotations=notes)) for i in range(size)]
        _all_bind_first_time(client, api, members, nodes)


def _all_bind_first_time(
    client: TestClient, api: FakeApiServer, members: list[dict[str, Any]], candidates: list[str]
) -> None:
    chosen: list[str] = []
    errors: list[str] = []
    threads: list[threading.Thread] = []
    api.bind_gate.clear()  # every Binding is held open at the API server
    for i, member in enumerate(members):
        # As kube-scheduler: the nodes it assumed for earlier members are no candidates.
        passing = _filter(client, member, [n for n in candidates if n not in chosen])
        assert len(passing) == 1, passing  # exactly the node of this member's task
        chosen.append(passing[0])
        threads.append(_bind_later(client, member, passing[0], errors))
        if i == 0:  # the next members are filtered while this bind is in flight
            wait_until(
                lambda: client.get(
                    "/v1/allocations", params={"job_id": "k8s-gang:ml-team/trio"}
                ).json()["allocations"],
                "the gang reserved by the first bind",
            )
    api.bind_gate.set()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == [""] * len(members)  # no member refused at bind
    assert len(set(chosen)) == len(members)
    (gang,) = client.get("/v1/allocations", params={"job_id": "k8s-gang:ml-team/trio"}).json()[
        "allocations"
    ]
    assert sorted(t["node"] for t in gang["tasks"]) == sorted(chosen)
    assert gang["state"] == "active"


def test_members_filtered_before_the_first_bind_follow_the_first_plan(
    client: TestClient, api: FakeApiServer
):
    # The first bind has not reached the extender yet when the others are filtered.
    members = [api.add(pod(f"trio-{i}", 8, annotations=TRIO)) for i in range(3)]
    chosen: list[str] = []
    for member in members:
        passing = _filter(client, member, [n for n in NODES if n not in chosen])
        assert len(passing) == 1, passing
        chosen.append(passing[0])
    for member, node in zip(members, chosen, strict=True):
        assert client.post("/k8s/v1/bind", json=binding_args(member, node)).json() == {"Error": ""}
    # A member filtered again (a retry) keeps its node.
    assert _filter(client, members[1], NODES) == [chosen[1]]
