"""A cordon holds from its answer on, whichever replica a placement reaches.

An operator cordons a node through one replica; another replica whose memory has
not heard of it yet (its notification is on the way, or lost until the next
resync) must still place nothing new there: through /v1/place, the Slurm
job-submit route or the Kubernetes extender's bind. Its commit is refused in the
database and the request decided again on the stored state. An uncordon is
never lost either: holds taken before, during and after a cordon stay, and the
node takes new placements again once it is uncordoned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, pod
from service import schema
from service.settings import Settings
from service.state import ServiceState
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import deaf_listener, replica  # noqa: F401
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NO_VAL = 4294967294


pytestmark = pytest.mark.usefixtures("deaf_listener")


def _state(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def _held_nodes(client: TestClient) -> set[str]:
    held = schema.holdings()
    with _state(client).engine.connect() as conn:
        return {str(node) for (node,) in conn.execute(sa.select(held.c.node)).all()}


@contextlib.contextmanager
def cordoned_pair(
    settings: Settings, clock: FakeClock, kube: FakeKubeApi
) -> Iterator[tuple[TestClient, TestClient]]:
    """(a replica that cordoned h0, a replica behind that has not heard of it); h1 is free."""
    with replica(settings, clock, kube) as first:
        add_nodes(first, ("hgx-h100", "h0"), ("hgx-h100", "h1"))
        with replica(settings, clock, kube) as behind:
            assert "h0" in _state(behind).cluster
            answer = first.post("/v1/nodes/h0/cordon")
            assert answer.status_code == 200, answer.text
            assert "h0" not in _state(behind).cordoned  # its memory has not heard of it
            yield first, behind


def test_a_replica_behind_a_cordon_places_nothing_there_through_place(
    settings: Settings, clock: FakeClock
) -> None:
    with cordoned_pair(settings, clock, FakeKubeApi()) as (_, behind):
        only_there = behind.post("/v1/place", json={"gpus": 1, "nodes": ["h0"]})
        assert only_there.status_code == 409, only_there.text
        assert _held_nodes(behind) == set()
        assert "h0" in _state(behind).cordoned  # it read the node again
        anywhere = behind.post("/v1/place", json={"gpus": 1})
        assert anywhere.status_code == 201, anywhere.text
        assert anywhere.json()["tasks"][0]["node"] == "h1"
        assert _held_nodes(behind) == {"h1"}


def test_a_replica_behind_a_cordon_places_nothing_there_through_slurm(
    settings: Settings, clock: FakeClock
) -> None:
    with cordoned_pair(settings, clock, FakeKubeApi()) as (_, behind):
        job = {
            "min_nodes": NO_VAL,
            "max_nodes": NO_VAL,
            "num_tasks": NO_VAL,
            "user_name": "alice",
            "tres_per_job": "gres:gpu:2",
            "partition_nodes": "h0",
        }
        answer = behind.post("/v1/slurm/job-submit", json=job)
        assert answer.status_code == 200, answer.text
        assert answer.json()["action"] != "modify", answer.json()
        assert _held_nodes(behind) == set()


def test_a_replica_behind_a_cordon_binds_nothing_there(
    settings: Settings, clock: FakeClock
) -> None:
    kube = FakeKubeApi()
    with cordoned_pair(settings, clock, kube) as (_, behind):
        p = kube.add(pod("trainer-0", 2))
        answer = behind.post("/k8s/v1/bind", json=binding_args(p, "h0"))
        assert answer.status_code == 200, answer.text
        assert answer.json()["Error"], answer.json()
        assert kube.bindings == []
        assert _held_nodes(behind) == set()


def test_holds_outlive_a_cordon_and_an_uncordon_is_not_lost(
    settings: Settings, clock: FakeClock
) -> None:
    with cordoned_pair(settings, clock, FakeKubeApi()) as (first, behind):
        assert first.post("/v1/nodes/h0/uncordon").status_code == 200
        before = first.post("/v1/place", json={"gpus": 2, "nodes": ["h0"]})
        assert before.status_code == 201, before.text
        assert first.post("/v1/nodes/h0/cordon").status_code == 200
        assert first.post("/v1/nodes/h0/uncordon").status_code == 200
        # The replica behind heard of none of it, and still places there.
        after = behind.post("/v1/place", json={"gpus": 2, "nodes": ["h0"]})
        assert after.status_code == 201, after.text
        ids = {before.json()["id"], after.json()["id"]}
        listed: list[dict[str, Any]] = first.get("/v1/nodes/h0").json()["allocations"]
        assert set(listed) == ids
        # A reservation made before the cordon is still released normally.
        released = first.post(f"/v1/allocations/{before.json()['id']}/release")
        assert released.status_code == 200, released.text


def test_a_replica_behind_a_cordon_adds_no_share_to_a_gpu_shared_there(
    settings: Settings, clock: FakeClock
) -> None:
    """A share joins its GPU's pool row, which a share taken before the cordon made:
    the row the cordon carried along is checked again, not taken as it was."""
    with cordoned_pair(settings, clock, FakeKubeApi()) as (first, behind):
        assert first.post("/v1/nodes/h0/uncordon").status_code == 200
        shared = first.post("/v1/place", json={"gpu_fraction": 0.5, "nodes": ["h0"]})
        assert shared.status_code == 201, shared.text
        gpu = shared.json()["tasks"][0]["gpu_uuids"][0]
        assert first.post("/v1/nodes/h0/cordon").status_code == 200
        _state(behind).sync_nodes(["h0"])  # it knows of the share, and of no cordon
        _state(behind).cordoned.discard("h0")
        _state(behind).refresh_availability(["h0"])
        more = behind.post("/v1/place", json={"gpu_fraction": 0.25, "nodes": ["h0"]})
        assert more.status_code == 409, more.text
        listed = first.get("/v1/nodes/h0").json()
        assert listed["allocations"] == [shared.json()["id"]]
        assert {g["uuid"]: g["share_milli"] for g in listed["gpus"]}[gpu] == 500
