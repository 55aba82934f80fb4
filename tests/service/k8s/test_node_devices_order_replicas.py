"""A node's device reports are taken in their Lists' order whichever replica answers them.

Two replicas on one database each answered a node's reports in their own order: an
older List answered on one replica after a newer one was taken on the other moved a
finished pod's allocation back onto the GPU the kubelet had given the next pod, until
that pod's next report. The newest List taken per node and resource is the
database's, checked and advanced in the transaction that takes the report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from placement.profiles import build_profile
from service.allocations import api as allocations_api
from service.settings import Settings
from tests.service.conftest import FakeClock
from tests.service.deaf_replicas import replica
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi
from tests.service.k8s.test_node_devices_order import _holder as holder
from tests.service.k8s.test_node_devices_order import bound_and_started

NODE = "h100-a"
DEVICE = build_profile("hgx-h100", NODE).gpus[0].uuid


@pytest.fixture
def other(
    settings: Settings, clock: FakeClock, kube: FakeKubeApi, now: datetime
) -> Iterator[TestClient]:
    """A second replica on the database of ``k8s_client``, started once the node is known."""
    with replica(settings, clock, kube) as client:
        yield client


@pytest.fixture
def now(k8s_client: TestClient, kube: FakeKubeApi) -> datetime:
    """The node known, and pods ``first`` and ``next`` bound to it and started."""
    add_nodes(k8s_client, ("hgx-h100", NODE))
    started = datetime.now(UTC) - timedelta(minutes=10)
    for name in ("first", "next"):
        bound_and_started(kube, name, started)
    return datetime.now(UTC)


def _report(client: TestClient, name: str, listed_at: datetime) -> Any:
    """Pod ``name`` on DEVICE, as the List read at ``listed_at`` says."""
    body = {
        "resource": "nvidia.com/gpu",
        "pods": [{"namespace": "ml-team", "name": name, "devices": [DEVICE]}],
        "listed_at": listed_at.isoformat(),
    }
    answer = client.post(f"/v1/nodes/{NODE}/k8s/devices", json=body)
    assert answer.status_code == 200, answer.text
    (outcome,) = answer.json()["outcomes"]
    return outcome


def _holder(client: TestClient) -> str | None:
    return holder(client, DEVICE)


def _before_the_write(monkeypatch: pytest.MonkeyPatch, then: Callable[[], None]) -> list[int]:
    """``then`` runs once, when the first report to get there has read and planned and is
    about to take its truths; the list counts the reports' takes."""
    real = allocations_api.observe_all
    calls: list[int] = []

    def hooked(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            then()
        return real(*args, **kwargs)

    monkeypatch.setattr(allocations_api, "observe_all", hooked)
    return calls


def test_an_older_list_answered_on_another_replica_moves_nothing_back(
    k8s_client: TestClient, now: datetime, other: TestClient
) -> None:
    assert _report(k8s_client, "next", now)["action"] == "created"
    stale = _report(other, "first", now - timedelta(seconds=10))
    assert stale["action"] == "deferred", stale
    assert "newer" in stale["message"]
    assert _holder(k8s_client) == "k8s-pod:ml-team/next"
    assert _holder(other) == "k8s-pod:ml-team/next"


def test_an_older_list_planned_before_a_newer_one_commits_elsewhere_writes_nothing(
    k8s_client: TestClient, now: datetime, other: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The older report has read the allocations and planned its move when the newer one
    commits on the other replica: its write comes after, and must not be taken."""

    def newer_elsewhere() -> None:
        assert _report(k8s_client, "next", now)["action"] == "created"

    _before_the_write(monkeypatch, newer_elsewhere)
    stale = _report(other, "first", now - timedelta(seconds=10))
    assert stale["action"] == "deferred", stale
    assert _holder(k8s_client) == "k8s-pod:ml-team/next"


def test_a_newer_list_planned_before_an_older_one_commits_elsewhere_is_read_again(
    k8s_client: TestClient, now: datetime, other: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The newer report found its pod's allocation on its devices (nothing to move); an
    older report, taken meanwhile on the other replica, moved them onto another pod.
    The newer report, taken last, is read again, and its truth is what holds."""
    assert _report(k8s_client, "next", now - timedelta(seconds=20))["action"] == "created"

    def older_elsewhere() -> None:
        assert _report(k8s_client, "first", now - timedelta(seconds=10))["action"] == "created"

    takes = _before_the_write(monkeypatch, older_elsewhere)
    newer = _report(other, "next", now)
    assert newer["action"] == "created", newer
    assert _holder(k8s_client) == "k8s-pod:ml-team/next"
    assert len(takes) == 3  # the newer report's first take, the older one's, the newer's again
