"""A gang whose pods the Kubernetes API does not list is not remembered as read.

After a restart (the gang forgotten) the claims of a gang's members are rebuilt from
their pods. An API that fails then must not leave the gang remembered with no claims:
every task would look free, and the next member would be put on a task a running
member holds. The member is refused for now; the next filter or bind lists again."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.k8s.kube_api import KubeApiError
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODES = ["h100-a", "h100-b"]
RING = {
    "topoplace.io/gang": "ring",
    "topoplace.io/gang-size": "2",
    "topoplace.io/locality": "nvlink",
}
GANG = "k8s-gang:ml-team/ring"


class ListingFails:
    """The fake API's list_pods, failing while ``failing`` is set; counts the calls."""

    def __init__(self, kube: FakeKubeApi) -> None:
        self.list = kube.list_pods
        self.failing = False
        self.calls = 0

    def __call__(self, namespace: str | None = None) -> list[dict[str, Any]]:
        self.calls += 1
        if self.failing:
            raise KubeApiError(503, "the server is currently unable to handle the request")
        return self.list(namespace)


@pytest.fixture
def restarted(
    k8s_client: TestClient, kube: FakeKubeApi, monkeypatch: pytest.MonkeyPatch
) -> tuple[TestClient, dict[str, Any], ListingFails]:
    """ring-0 bound on h100-a, then the gang forgotten (as after a restart) while the API
    fails to list pods; returns the client, ring-1 and the listing."""
    add_nodes(k8s_client, ("hgx-h100", "h100-a"), ("hgx-h100", "h100-b"))
    first = kube.add(pod("ring-0", 8, annotations=RING))
    second = kube.add(pod("ring-1", 8, annotations=RING))
    assert _bind(k8s_client, first, "h100-a") == ""
    listing = ListingFails(kube)
    monkeypatch.setattr(kube, "list_pods", listing)
    k8s_client.app.state.k8s.gangs.forget(GANG)  # type: ignore[attr-defined]
    listing.failing = True
    return k8s_client, second, listing


def _filter(client: TestClient, p: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = client.post("/k8s/v1/filter", json=names_args(p, NODES)).json()
    return result


def _bind(client: TestClient, p: dict[str, Any], node: str) -> str:
    error: str = client.post("/k8s/v1/bind", json=binding_args(p, node)).json()["Error"]
    return error


def test_a_filter_that_cannot_read_the_gang_passes_no_node_and_reads_it_again(
    restarted: tuple[TestClient, dict[str, Any], ListingFails],
) -> None:
    client, second, listing = restarted
    refused = _filter(client, second)
    assert refused["NodeNames"] == []  # was ["h100-a"]: ring-0's task, taken for free
    assert not refused["FailedAndUnresolvableNodes"]  # kube-scheduler tries again
    assert "could not be read from the Kubernetes API" in refused["FailedNodes"]["h100-a"]
    tried = listing.calls
    listing.failing = False
    assert _filter(client, second)["NodeNames"] == ["h100-b"]
    assert listing.calls > tried  # read again, not remembered from the failed read
    assert _bind(client, second, "h100-b") == ""


def test_a_bind_that_cannot_read_the_gang_is_refused_and_binds_once_read(
    restarted: tuple[TestClient, dict[str, Any], ListingFails], kube: FakeKubeApi
) -> None:
    client, second, listing = restarted
    error = _bind(client, second, "h100-a")
    assert "could not be read from the Kubernetes API" in error
    assert [b["metadata"]["name"] for b in kube.bindings] == ["ring-0"]
    listing.failing = False
    # Read now: ring-0 holds h100-a's task, so ring-1 is told where the free one is.
    assert "h100-b" in _bind(client, second, "h100-a")
    assert _bind(client, second, "h100-b") == ""
