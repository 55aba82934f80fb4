"""kube-scheduler's sequences against a running service and a Kubernetes API on loopback.

A real `topoplace serve` process (uvicorn, real HTTP), reaching a fake API
server through a kubeconfig with a bearer token, as the extender would in a
cluster. The scheduler's calls are replayed as a real one makes them:
filter, prioritize, bind; and filter then bind straight away when one node
is left (prioritize is skipped then). The reconciler runs for real too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.k8s_objects import binding_args, names_args, nodes_args, pod
from placement.profiles import build_profile
from tests.service.k8s.fake_api_server import FakeApiServer
from tests.service.replica_processes import start, stop, wait_ready

TOKEN = "scheduler-sa-token"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    server = FakeApiServer(TOKEN).start()
    yield server
    server.stop()


@pytest.fixture
def service(api: FakeApiServer, database_url: str, tmp_path: Path) -> Iterator[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
current-context: test
clusters:
- name: fake
  cluster:
    server: {api.url}
users:
- name: scheduler
  user:
    token: {TOKEN}
contexts:
- name: test
  context:
    cluster: fake
    user: scheduler
"""
    )
    env = {
        "TOPOPLACE_HEARTBEAT_TTL_S": "3600",
        "TOPOPLACE_K8S_KUBECONFIG": str(kubeconfig),
        "TOPOPLACE_K8S_RECONCILE_INTERVAL_S": "0.3",
        "TOPOPLACE_K8S_RECONCILE_GRACE_S": "0",
    }
    # REST only, on a free port: a service still stopping (a slow machine) held the
    # default gRPC port, and the next test's service exited 2 on it.
    url, proc = start(database_url, env)
    try:
        wait_ready(url, proc)
        for profile, name in (
            ("hgx-h100", "h100-a"),
            ("dgx1-v100", "v100-b"),
            ("pcie-8x-l40s", "l40s-c"),
        ):
            snap = build_profile(profile, name)
            reply = httpx.put(
                f"{url}/v1/nodes/{name}/snapshot", json={"snapshot": snap.model_dump(mode="json")}
            )
            assert reply.status_code == 200, reply.text
        yield url
    finally:
        stop(proc)


def _call(url: str, verb: str, body: dict[str, Any]) -> Any:
    reply = httpx.post(f"{url}/k8s/v1/{verb}", json=body, timeout=5.0)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_filter_prioritize_bind(service: str, api: FakeApiServer):
    p = api.add(pod("trainer-0", 4, annotations={"topoplace.io/locality": "nvlink"}))
    candidates = ["h100-a", "v100-b", "l40s-c"]
    filtered = _call(service, "filter", names_args(p, candidates))
    assert filtered["NodeNames"] == ["h100-a", "v100-b"]
    assert list(filtered["FailedAndUnresolvableNodes"]) == ["l40s-c"]
    scores = _call(service, "prioritize", names_args(p, filtered["NodeNames"]))
    best = max(scores, key=lambda h: h["Score"])["Host"]
    assert best == "h100-a"

    assert _call(service, "bind", binding_args(p, best)) == {"Error": ""}

    (binding,) = api.bindings
    assert binding["path"] == "/api/v1/namespaces/ml-team/pods/trainer-0/binding"
    assert binding["content_type"] == "application/json"
    body = binding["body"]
    assert body["kind"] == "Binding" and body["target"]["name"] == "h100-a"
    bound = api.pod("ml-team", "trainer-0")
    assert bound["spec"]["nodeName"] == "h100-a"
    (allocation,) = httpx.get(
        f"{service}/v1/allocations", params={"job_id": p["metadata"]["uid"]}
    ).json()["allocations"]
    assert allocation["state"] == "active"
    task = allocation["tasks"][0]
    assert bound["metadata"]["annotations"]["topoplace.io/gpus"] == ",".join(task["gpu_uuids"])
    assert bound["metadata"]["annotations"]["topoplace.io/gpu-indices"] == ",".join(
        map(str, task["gpu_indices"])
    )

    # The pod finishes and is deleted: the reconciler gives its GPUs back.
    api.delete("ml-team", "trainer-0")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        state = httpx.get(f"{service}/v1/allocations/{allocation['id']}").json()["state"]
        if state == "released":
            break
        time.sleep(0.1)
    assert state == "released"


def test_filter_then_bind_with_one_node_left(service: str, api: FakeApiServer):
    busy = httpx.post(f"{service}/v1/place", json={"gpus": 3, "nodes": ["v100-b"]})
    assert busy.status_code == 201
    p = api.add(pod("trainer-1", 2))
    # Full-Node mode this time; one node left, so the scheduler skips prioritize.
    filtered = _call(service, "filter", nodes_args(p, ["v100-b"]))
    assert [n["metadata"]["name"] for n in filtered["Nodes"]["items"]] == ["v100-b"]
    promised = httpx.post(f"{service}/v1/score", json={"gpus": 2, "nodes": ["v100-b"]}).json()[
        "nodes"
    ][0]
    assert _call(service, "bind", binding_args(p, "v100-b")) == {"Error": ""}
    notes = api.pod("ml-team", "trainer-1")["metadata"]["annotations"]
    assert notes["topoplace.io/gpu-indices"] == ",".join(map(str, promised["task"]["gpu_indices"]))
    assert notes["topoplace.io/gpus"] == ",".join(promised["task"]["gpu_uuids"])
    # A second bind for the same pod (a retry after a lost reply) books nothing more.
    assert _call(service, "bind", binding_args(p, "v100-b")) == {"Error": ""}
    free = httpx.get(f"{service}/v1/nodes/v100-b").json()["free_gpus"]
    assert len(free) == 3
