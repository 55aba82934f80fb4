"""/place refusals: 422 `unresolvable` for what the cluster could never hold, 409
`unschedulable` with Retry-After for what may fit once cordoned, stale or busy capacity
comes back."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi.testclient import TestClient

from tests.service.helpers import add_nodes

# 9 HGX H100 (8 GPUs, 192 CPUs each) and a 4-GPU node: 76 GPUs.
CLUSTER_OF_76 = (*(("hgx-h100", f"h{i}") for i in range(9)), ("riscv-nvlfusion-4", "r0"))


def _never(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 422, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "unresolvable"
    assert "Retry-After" not in response.headers  # retrying cannot help
    return error


def _later(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 409, response.text
    error: dict[str, Any] = response.json()["error"]
    assert error["code"] == "unschedulable"
    assert response.headers["Retry-After"] == "5"
    return error


def test_gang_larger_than_the_cluster_is_422(client: TestClient) -> None:
    add_nodes(client, *CLUSTER_OF_76)
    error = _never(client.post("/v1/place", json={"gpus": 8, "tasks": 1000}))
    assert "the cluster has 76 GPUs in all; this gang needs 8000" in error["message"]
    assert error["detail"]["reasons"][0]["cause"] == "gang"


def test_gang_that_needs_cordoned_nodes_back_is_409(client: TestClient) -> None:
    add_nodes(client, *CLUSTER_OF_76)
    for name in ("h0", "h1"):
        assert client.post(f"/v1/nodes/{name}/cordon").status_code == 200
    error = _later(client.post("/v1/place", json={"gpus": 8, "tasks": 9}))
    causes = {r["cause"]: r for r in error["detail"]["reasons"]}
    assert causes["unavailable"]["nodes"] == 2 and causes["unavailable"]["resolvable"]
    _never(client.post("/v1/place", json={"gpus": 8, "tasks": 10}))


def test_more_cpus_per_task_than_any_node_has_is_422(client: TestClient) -> None:
    add_nodes(client, ("hgx-b200", "b0"), ("hgx-b200", "b1"))  # 224 CPUs each
    assert client.post("/v1/nodes/b1/cordon").status_code == 200
    error = _never(client.post("/v1/place", json={"gpus": 1, "cpus_per_task": 4096}))
    assert error["message"].endswith("no node has 4096 CPUs; the largest has 224")
    assert [(r["cause"], r["nodes"], r["resolvable"]) for r in error["detail"]["reasons"]] == [
        ("too_few_cpus", 2, False)
    ]


def test_cpus_only_a_cordoned_node_has_are_409(client: TestClient) -> None:
    add_nodes(client, ("hgx-b200", "b0"), ("dgx1-v100", "v0"))  # 224 and 80 CPUs
    assert client.post("/v1/nodes/b0/cordon").status_code == 200
    _later(client.post("/v1/place", json={"gpus": 1, "cpus_per_task": 200}))


def test_only_unknown_named_nodes_is_422(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    error = _never(client.post("/v1/place", json={"gpus": 1, "nodes": ["ghost"]}))
    assert error["message"].endswith("no topoplace agent has reported a node named ghost")
    assert [(r["cause"], r["nodes"], r["resolvable"]) for r in error["detail"]["reasons"]] == [
        ("not_registered", 1, False)
    ]


def test_an_unknown_name_beside_a_cordoned_node_is_409(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    assert client.post("/v1/nodes/h0/cordon").status_code == 200
    _later(client.post("/v1/place", json={"gpus": 1, "nodes": ["ghost", "h0"]}))


def test_sixteen_gpus_on_three_8_gpu_nodes_says_no_node_has_them(client: TestClient) -> None:
    add_nodes(client, *(("dgx1-v100", f"dgx{i}") for i in range(3)))
    error = _never(client.post("/v1/place", json={"gpus": 16}))
    assert error["message"].endswith("no node has 16 GPUs; the largest has 8")
    assert "in total" not in error["message"]


def test_a_gpu_model_no_node_has_is_422(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    error = _never(client.post("/v1/place", json={"gpus": 1, "gpu_models": ["B200"]}))
    assert error["message"].endswith("no node has a GPU of model B200")


def test_busy_gpus_stay_409(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    assert client.post("/v1/place", json={"gpus": 8}).status_code == 201
    _later(client.post("/v1/place", json={"gpus": 1}))
    _later(client.post("/v1/place", json={"gpus": 4, "tasks": 2}))
