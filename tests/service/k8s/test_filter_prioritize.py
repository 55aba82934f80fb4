"""filter and prioritize speak ExtenderArgs / ExtenderFilterResult / HostPriorityList exactly,
in both nodeCacheCapable modes, with realistic Pod and Node objects."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import names_args, node, nodes_args, pod
from tests.service.helpers import add_nodes

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
CANDIDATES = ["h100-a", "l40s-b", "v100-c", "ghost-d"]


@pytest.fixture
def fleet(k8s_client: TestClient) -> TestClient:
    add_nodes(
        k8s_client, ("hgx-h100", "h100-a"), ("pcie-8x-l40s", "l40s-b"), ("dgx1-v100", "v100-c")
    )
    return k8s_client


def _post(client: TestClient, verb: str, body: dict[str, Any]) -> Any:
    response = client.post(f"/k8s/v1/{verb}", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()


def test_filter_names_mode_sorts_nodes_into_pass_failed_and_unresolvable(fleet: TestClient):
    p = pod("trainer-0", 4, annotations={"topoplace.io/locality": "nvlink"})
    result = _post(fleet, "filter", names_args(p, CANDIDATES))
    assert set(result) == FILTER_KEYS
    assert result["Nodes"] is None
    assert result["Error"] == ""
    assert result["NodeNames"] == ["h100-a", "v100-c"]
    # An L40S box has no NVLink at all: never, so not worth preempting for.
    assert set(result["FailedAndUnresolvableNodes"]) == {"l40s-b"}
    assert "connected by NVLink" in result["FailedAndUnresolvableNodes"]["l40s-b"]
    # A node without an agent may get one: resolvable.
    assert set(result["FailedNodes"]) == {"ghost-d"}
    assert result["FailedNodes"]["ghost-d"].startswith("topoplace: ")


def test_filter_full_node_mode_answers_with_the_node_objects_sent(fleet: TestClient):
    p = pod("trainer-0", 4, annotations={"topoplace.io/locality": "nvlink"})
    args = nodes_args(p, CANDIDATES)
    result = _post(fleet, "filter", args)
    assert set(result) == FILTER_KEYS
    assert result["NodeNames"] is None
    assert result["Nodes"]["metadata"] == {}
    sent = {n["metadata"]["name"]: n for n in args["Nodes"]["items"]}
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["h100-a", "v100-c"]
    for item in result["Nodes"]["items"]:
        assert item == sent[item["metadata"]["name"]]  # unchanged, managedFields and all
    assert set(result["FailedAndUnresolvableNodes"]) == {"l40s-b"}
    assert set(result["FailedNodes"]) == {"ghost-d"}


@pytest.mark.parametrize("mode", ["names", "nodes"])
def test_prioritize_scores_every_node_sent_on_0_to_10(fleet: TestClient, mode: str):
    p = pod("trainer-0", 4)
    build = names_args if mode == "names" else nodes_args
    _post(fleet, "filter", build(p, CANDIDATES))
    result = _post(fleet, "prioritize", build(p, CANDIDATES))
    assert [set(h) for h in result] == [{"Host", "Score"}] * len(CANDIDATES)
    assert [h["Host"] for h in result] == CANDIDATES
    scores = {h["Host"]: h["Score"] for h in result}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert scores["ghost-d"] == 0
    # 4 GPUs on NVSwitch beat 4 over PCIe or a hybrid cube-mesh: the H100 box is the best.
    assert scores["h100-a"] == 10
    assert max(scores["l40s-b"], scores["v100-c"]) < 10


def test_prioritize_without_a_filter_before_it_answers_the_same(fleet: TestClient):
    p = pod("trainer-0", 2)
    direct = _post(fleet, "prioritize", names_args(p, CANDIDATES))
    _post(fleet, "filter", names_args(p, CANDIDATES))
    after_filter = _post(fleet, "prioritize", names_args(p, CANDIDATES))
    assert direct == after_filter


def test_busy_nodes_are_failed_not_unresolvable(fleet: TestClient):
    for _ in range(2):
        taken = fleet.post("/v1/place", json={"gpus": 4, "nodes": ["h100-a"]})
        assert taken.status_code == 201, taken.text
    result = _post(fleet, "filter", names_args(pod("late", 4), ["h100-a"]))
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"h100-a": "topoplace: fewer than 4 GPUs free"}
    assert result["FailedAndUnresolvableNodes"] == {}


def test_a_bad_annotation_fails_every_node_naming_the_annotation(fleet: TestClient):
    p = pod("trainer-0", 4, annotations={"topoplace.io/locality": "fast"})
    result = _post(fleet, "filter", names_args(p, CANDIDATES))
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {}
    assert set(result["FailedAndUnresolvableNodes"]) == set(CANDIDATES)
    message = result["FailedAndUnresolvableNodes"]["h100-a"]
    assert "topoplace.io/locality" in message and "'fast'" in message
    scores = _post(fleet, "prioritize", names_args(p, CANDIDATES))
    assert {h["Score"] for h in scores} == {0}


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({"gpu.request.locality": "close"}, "gpu.request.locality"),
        ({"gpu.request.count": "2"}, "gpu.request.count"),
        ({"topoplace.io/policy": "random"}, "topoplace.io/policy"),
        ({"topoplace.io/numa": "yes"}, "topoplace.io/numa"),
        ({"topoplace.io/gang": "g"}, "topoplace.io/gang-size"),
        ({"topoplace.io/gang": "g", "topoplace.io/gang-size": "many"}, "topoplace.io/gang-size"),
    ],
)
def test_each_bad_annotation_is_named(fleet: TestClient, annotations: dict[str, str], named: str):
    result = _post(fleet, "filter", names_args(pod("p", 4, annotations=annotations), ["h100-a"]))
    assert named in result["FailedAndUnresolvableNodes"]["h100-a"]


def test_common_guide_annotations_are_accepted(fleet: TestClient):
    p = pod("p", 4, annotations={"gpu.request.count": "4", "gpu.request.locality": "nvlink"})
    result = _post(fleet, "filter", names_args(p, CANDIDATES))
    assert result["NodeNames"] == ["h100-a", "v100-c"]
    assert set(result["FailedAndUnresolvableNodes"]) == {"l40s-b"}


def test_a_pod_without_gpus_passes_everywhere(fleet: TestClient):
    result = _post(fleet, "filter", names_args(pod("web", 0), CANDIDATES))
    assert result["NodeNames"] == CANDIDATES
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


def test_mig_pods_are_judged_by_profile(k8s_client: TestClient):
    add_nodes(k8s_client, ("dgx-a100-mig", "a100-mig"), ("hgx-h100", "h100-a"))
    p = pod("infer", 1, resource="nvidia.com/mig-3g.40gb")
    result = _post(k8s_client, "filter", names_args(p, ["a100-mig", "h100-a"]))
    assert result["NodeNames"] == ["a100-mig"]
    assert "3g.40gb" in result["FailedAndUnresolvableNodes"]["h100-a"]
    scores = _post(k8s_client, "prioritize", names_args(p, ["a100-mig", "h100-a"]))
    assert scores == [{"Host": "a100-mig", "Score": 10}, {"Host": "h100-a", "Score": 0}]


def test_keys_are_read_case_insensitively_like_go(fleet: TestClient):
    body = {"pod": pod("p", 8), "nodes": None, "nodenames": ["h100-a", "l40s-b"]}
    result = _post(fleet, "filter", body)
    assert result["NodeNames"] == ["h100-a", "l40s-b"]


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"Pod": 3, "NodeNames": []}',
        b'{"Pod": {}, "Nodes": null, "NodeNames": null}',
    ],
)
def test_malformed_bodies_get_400_in_the_service_error_shape(fleet: TestClient, body: bytes):
    response = fleet.post(
        "/k8s/v1/filter", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_request"


def test_node_objects_without_names_are_refused(fleet: TestClient):
    bad = node("x")
    del bad["metadata"]["name"]
    body = {"Pod": pod("p", 1), "Nodes": {"metadata": {}, "items": [bad]}, "NodeNames": None}
    response = fleet.post("/k8s/v1/filter", json=body)
    assert response.status_code == 400
    assert "metadata.name" in response.json()["error"]["message"]


def test_prioritize_of_the_passing_nodes_matches_the_full_list(fleet: TestClient):
    p = pod("trainer-0", 2)
    passed = _post(fleet, "filter", names_args(p, CANDIDATES))["NodeNames"]
    everything = {
        h["Host"]: h["Score"] for h in _post(fleet, "prioritize", names_args(p, CANDIDATES))
    }
    only_passed = _post(fleet, "prioritize", names_args(p, passed))
    assert only_passed == [{"Host": n, "Score": everything[n]} for n in passed]


def test_prioritize_after_the_cluster_changed_asks_the_engine_again(fleet: TestClient):
    p = pod("trainer-0", 4)
    passed = _post(fleet, "filter", names_args(p, CANDIDATES))["NodeNames"]
    assert "h100-a" in passed
    taken = fleet.post("/v1/place", json={"gpus": 8, "nodes": ["h100-a"]})
    assert taken.status_code == 201
    scores = {h["Host"]: h["Score"] for h in _post(fleet, "prioritize", names_args(p, passed))}
    assert scores["h100-a"] == 0
    assert max(scores.values()) == 10


@pytest.mark.parametrize("mode", ["names", "nodes"])
@pytest.mark.parametrize(
    ("gpus", "resource"),
    [(2, "nvidia.com/gpu"), (1, "nvidia.com/mig-1g.10gb"), (2, "nvidia.com/mig-1g.10gb")],
)
def test_every_node_sent_is_passed_or_given_a_reason(
    k8s_client: TestClient, mode: str, gpus: int, resource: str
):
    # kube-scheduler reports the reasons in the pod's FailedScheduling event: a node that
    # is neither passed nor failed is dropped with none ("0/3 nodes are available: 1 ...,
    # 1 ..." counting two). A single MIG instance's judgement left out the unreported node.
    add_nodes(k8s_client, ("dgx-a100-mig", "a100-mig"), ("hgx-h100", "h100-a"))
    p = pod("infer", gpus, resource=resource)
    sent = ["a100-mig", "h100-a", "ghost-d"]
    build = names_args if mode == "names" else nodes_args
    result = _post(k8s_client, "filter", build(p, sent))
    if mode == "names":
        passing = result["NodeNames"]
    else:
        passing = [n["metadata"]["name"] for n in result["Nodes"]["items"]]
    failed, unresolvable = result["FailedNodes"], result["FailedAndUnresolvableNodes"]
    assert sorted([*passing, *failed, *unresolvable]) == sorted(sent)
    assert failed["ghost-d"] == "topoplace: no topoplace agent has reported this node"
