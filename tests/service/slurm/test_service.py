"""The Slurm decision reads the engine's state only under the state lock (the engine's
contract, placement/cluster.py): a stand-in for the state refuses any other read."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from placement import ClusterState
from placement.profiles import build_profile
from service.db import make_engine
from service.settings import Settings
from service.slurm import service
from service.slurm.schemas import JobSubmit
from service.state import ServiceState
from tests.service.helpers import add_nodes
from tests.service.slurm.test_job_submit_api import NO_VAL


class OwnedLock:
    """A reentrant lock that says whether the calling thread holds it."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._owner: int | None = None
        self._depth = 0

    def __enter__(self) -> OwnedLock:
        self._lock.acquire()
        self._owner = threading.get_ident()
        self._depth += 1
        return self

    def __exit__(self, *_: object) -> None:
        self._depth -= 1
        if not self._depth:
            self._owner = None
        self._lock.release()

    def held(self) -> bool:
        return self._owner == threading.get_ident()


class LockedReads:
    """The engine's state, refusing every read by a thread that does not hold the lock."""

    def __init__(self, cluster: ClusterState, lock: OwnedLock) -> None:
        self._cluster = cluster
        self._lock = lock

    def _check(self, what: str) -> None:
        assert self._lock.held(), f"ClusterState.{what} read without the state lock"

    def __getattr__(self, name: str) -> Any:
        self._check(name)
        return getattr(self._cluster, name)

    def __contains__(self, name: object) -> bool:
        self._check("__contains__")
        return name in self._cluster

    def __len__(self) -> int:
        self._check("__len__")
        return len(self._cluster)


@pytest.fixture
def locked_state(tmp_path: Path) -> ServiceState:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'slurm.sqlite3'}")
    state = ServiceState(settings, make_engine(settings.database_url))
    for name in ("node1", "node2", "node3"):
        state.cluster.upsert(build_profile("dgx1-v100", name))
    lock = OwnedLock()
    state.lock = lock  # type: ignore[assignment]
    state.cluster = LockedReads(state.cluster, lock)  # type: ignore[assignment]
    return state


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, (1, None, ())),
        (
            {"partition_nodes": "node[1-2]", "exc_nodes": "node2"},
            (1, ("node1", "node2"), ("node2",)),
        ),
        ({"req_nodes": "node[2-3]", "partition_nodes": "node[1-3]"}, (2, ("node2", "node3"), ())),
        ({"features": "gpu_v100&nvisland8", "min_nodes": 2}, (2, ("node1", "node2", "node3"), ())),
    ],
)
def test_the_candidates_are_read_under_the_state_lock(
    locked_state: ServiceState, fields: dict[str, Any], expected: tuple[Any, ...]
) -> None:
    assert service._nodes(locked_state, JobSubmit(**fields), {}) == expected


def test_the_check_refuses_a_read_without_the_lock(locked_state: ServiceState) -> None:
    with pytest.raises(AssertionError, match="without the state lock"):
        locked_state.cluster.names()
    with locked_state.lock:
        assert locked_state.cluster.names() == ["node1", "node2", "node3"]


def test_a_whole_submission_reads_the_engine_only_under_the_lock(client: TestClient) -> None:
    add_nodes(client, ("dgx1-v100", "node1"), ("dgx1-v100", "node2"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    lock = OwnedLock()
    state.lock = lock  # type: ignore[assignment]
    state.cluster = LockedReads(state.cluster, lock)  # type: ignore[assignment]
    unset = {"min_nodes": NO_VAL, "max_nodes": NO_VAL, "num_tasks": NO_VAL}
    jobs = [
        {"tres_per_node": "gres:gpu:4", "min_nodes": 2, "max_nodes": 2},
        {"tres_per_node": "gres:gpu:2", "features": "nvisland8"},
        {"tres_per_job": "gres:gpu:2", "reserve": False},  # a proposal
    ]
    for job in jobs:
        response = client.post("/v1/slurm/job-submit", json={**unset, **job})
        assert response.status_code == 200 and response.json()["action"] == "modify", response.text
