"""A pod given GPUs a gang reserved for a member not admitted yet: the gang's other tasks stay.

The kubelet chooses among the devices it sees free, and a gang's task whose member
has not been admitted holds GPUs no container uses yet: a pod another scheduler
bound there (or one the kubelet gave other devices than reserved) may get them. The
truth wins for those GPUs, but the gang's tasks on other nodes hold the GPUs its
running members use.
"""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from tests.service.deaf_replicas import held
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

NODES = ("h100-a", "h100-b")
GANG = {"topoplace.io/gang": "pair", "topoplace.io/gang-size": "2"}


def _devices(p: dict[str, Any]) -> list[str]:
    return str(p["metadata"]["annotations"]["topoplace.io/gpus"]).split(",")


def _gpus(client: TestClient, node: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = client.get(f"/v1/nodes/{node}").json()["gpus"]
    return found


def _report(client: TestClient, node: str, name: str, devices: list[str]) -> Any:
    body = {"namespace": "ml-team", "name": name, "devices": devices}
    answer = client.post(
        f"/v1/nodes/{node}/k8s/devices", json={"resource": "nvidia.com/gpu", "pods": [body]}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()["outcomes"][0]


def test_a_pod_given_gpus_of_a_members_task_elsewhere_does_not_free_the_running_member(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    """A gang of two 6-GPU members: one task per node. pair-0 binds (the gang's whole
    reservation is made) and runs on h100-a; pair-1 is not bound yet. On the other node
    a pod bound by another scheduler gets two GPUs of pair-1's task. Its allocation takes
    those two: the gang keeps its reservation and every GPU pair-0 runs on (before, the
    gang's whole allocation was released as their stale holder, and pair-0's six GPUs
    looked free under it, for the next pod to be placed onto)."""
    add_nodes(k8s_client, *(("hgx-h100", n) for n in NODES))
    member = kube.add(pod("pair-0", 6, annotations=GANG))
    (node,) = k8s_client.post("/k8s/v1/filter", json=names_args(member, list(NODES))).json()[
        "NodeNames"
    ]
    assert k8s_client.post("/k8s/v1/bind", json=binding_args(member, node)).json() == {"Error": ""}
    kube.start("ml-team", "pair-0")
    first = kube.get_pod("ml-team", "pair-0") or {}
    gang_id = first["metadata"]["annotations"]["topoplace.io/allocation"]
    gang = k8s_client.get(f"/v1/allocations/{gang_id}").json()
    (other_node,) = [n for n in NODES if n != node]
    (open_task,) = [t for t in gang["tasks"] if t["node"] == other_node]
    assert _report(k8s_client, node, "pair-0", _devices(first))["action"] == "matched"

    stranger = pod("stranger", 2)
    stranger["spec"]["nodeName"] = other_node  # bound by another scheduler
    kube.add(stranger)
    kube.start("ml-team", "stranger")
    taken = sorted(open_task["gpu_uuids"])[:2]
    outcome = _report(k8s_client, other_node, "stranger", taken)
    assert outcome["action"] == "created", outcome

    now = k8s_client.get(f"/v1/allocations/{gang_id}").json()
    assert now["state"] in ("pending", "active"), "the gang's reservation was ended"
    running = {(node, d) for d in _devices(first)}
    assert running <= held(k8s_client), "GPUs the running member uses look free"
    assert {(other_node, d) for d in taken} <= held(k8s_client)
    # pair-1 binds onto its task and gets the six GPUs left free on its node: its task
    # moves onto them, and every GPU of the node is held once.
    second = kube.add(pod("pair-1", 6, annotations=GANG))
    names = k8s_client.post("/k8s/v1/filter", json=names_args(second, list(NODES))).json()
    assert names["NodeNames"] == [other_node]
    assert k8s_client.post("/k8s/v1/bind", json=binding_args(second, other_node)).json() == {
        "Error": ""
    }
    kube.start("ml-team", "pair-1")
    left = sorted({g["uuid"] for g in _gpus(k8s_client, other_node)} - set(taken))
    assert _report(k8s_client, other_node, "pair-1", left)["action"] == "moved"
    assert held(k8s_client) == running | {(other_node, d) for d in [*taken, *left]}
    # A next pod bound on pair-0's node is not given pair-0's GPUs.
    nxt = kube.add(pod("next", 2))
    assert k8s_client.post("/k8s/v1/bind", json=binding_args(nxt, node)).json() == {"Error": ""}
    assert not set(_devices(kube.get_pod("ml-team", "next") or {})) & set(_devices(first))
