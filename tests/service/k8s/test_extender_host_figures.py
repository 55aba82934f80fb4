"""The extender sends each GPU pod's CPU and memory requests: filter and prioritize skip
a node whose known host use leaves too little, and bind reserves with the figures, so
the next pod (and a restarted service) counts them."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from service.state import ServiceState
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODES = ["a", "b"]
# bench.k8s_objects.pod: the trainer requests 8 CPUs and 64Gi, its sidecar 100m and 64Mi.
POD_CPU, POD_MIB = 8100, 64 * 1024 + 64


def _service(client: TestClient) -> ServiceState:
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    return state


def _post(client: TestClient, verb: str, body: dict[str, Any]) -> Any:
    response = client.post(f"/k8s/v1/{verb}", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _busy_a(client: TestClient) -> int:
    """Hold one GPU of node a and all but 4 of its CPUs; returns a's CPUs in milli-CPU."""
    add_nodes(client, ("hgx-h100", "a"), ("hgx-h100", "b"))
    cpu, _ = _service(client).cluster.host_room("a")
    assert cpu is not None and cpu > POD_CPU  # the profile reports its CPUs
    held = client.post("/v1/place", json={"gpus": 1, "nodes": ["a"], "cpu_milli": cpu - 4000})
    assert held.status_code == 201, held.text
    return cpu


def test_without_host_figures_pack_prefers_the_busy_node(k8s_client: TestClient) -> None:
    """The baseline of the test below: a pod that requests no CPU or memory goes to a,
    the node packing prefers (one of its GPUs is taken)."""
    _busy_a(k8s_client)
    bare = pod("bare", 1)
    for container in bare["spec"]["containers"]:
        for kind in ("limits", "requests"):
            container["resources"][kind] = {
                k: v
                for k, v in container["resources"].get(kind, {}).items()
                if k not in ("cpu", "memory")
            }
    assert _post(k8s_client, "filter", names_args(bare, NODES))["NodeNames"] == NODES
    scores = {
        s["Host"]: s["Score"] for s in _post(k8s_client, "prioritize", names_args(bare, NODES))
    }
    assert scores["a"] == 10 and scores["b"] < 10


def test_a_node_short_of_cpu_is_not_chosen_and_bind_reserves_the_figures(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    _busy_a(k8s_client)
    p = kube.add(pod("trainer-0", 1))
    answer = _post(k8s_client, "filter", names_args(p, NODES))
    assert answer["NodeNames"] == ["b"]
    assert "host CPU or memory" in answer["FailedNodes"]["a"]  # resolvable: it may free up
    scores = _post(k8s_client, "prioritize", names_args(p, NODES))
    assert {s["Host"]: s["Score"] for s in scores}["a"] == 0
    assert _post(k8s_client, "bind", binding_args(p, "b"))["Error"] == ""
    service = _service(k8s_client)
    assert service.cluster.host_used("b") == (POD_CPU, POD_MIB)
    # Counted from the stored request, as every sync (and a restart) counts it.
    service.cluster.set_host_use("b", 0, 0)
    service.sync_nodes(["b"])
    assert service.cluster.host_used("b") == (POD_CPU, POD_MIB)
    (allocation,) = k8s_client.get(
        "/v1/allocations", params={"job_id": p["metadata"]["uid"]}
    ).json()["allocations"]
    assert allocation["state"] == "active" and allocation["tasks"][0]["node"] == "b"


def test_a_bind_to_a_node_short_of_cpu_reserves_nothing(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    """A Binding the scheduler asks for on a node whose known CPU is short (another
    replica placed there since this filter) is refused, naming the cause."""
    cpu = _busy_a(k8s_client)
    p = kube.add(pod("trainer-1", 1))
    error = _post(k8s_client, "bind", binding_args(p, "a"))["Error"]
    assert error.startswith("topoplace: cannot reserve GPUs on a") and "host" in error, error
    assert kube.bindings == []
    assert _service(k8s_client).cluster.host_used("a")[0] == cpu - 4000  # the first only


def test_gang_members_reserve_their_own_figures_per_task(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "a"), ("hgx-h100", "b"))
    notes = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}
    members = [kube.add(pod(f"pair-{i}", 8, annotations=notes)) for i in range(2)]
    for member in members:
        (node,) = _post(k8s_client, "filter", names_args(member, NODES))["NodeNames"]
        assert _post(k8s_client, "bind", binding_args(member, node))["Error"] == ""
    service = _service(k8s_client)
    # Each task holds one member's figures, not the gang's sum, on its own node.
    assert [service.cluster.host_used(n) for n in NODES] == [(POD_CPU, POD_MIB)] * 2
