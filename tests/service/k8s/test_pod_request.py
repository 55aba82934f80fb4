"""A pod whose resources or annotations topoplace cannot use is answered, never a fault.

Each such pod fails the filter on every node as unresolvable, with a message naming the
resource or annotation; prioritize scores it 0, preempt keeps no node, bind says why in
its Error; and the next pod is placed as if it had never come.
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import binding_args, names_args, pod
from tests.service.helpers import add_nodes
from tests.service.k8s.fake_kube import FakeKubeApi

MIG = "nvidia.com/mig-1g.10gb"


def _asking(amount: str, resource: str = "nvidia.com/gpu") -> dict[str, Any]:
    p = pod("odd-0", 1)
    for kind in ("limits", "requests"):
        p["spec"]["containers"][0]["resources"][kind] = {resource: amount}
    return p


ODD_RESOURCES = [
    pytest.param(_asking("\u00b2"), "nvidia.com/gpu", id="superscript-digit"),
    pytest.param(_asking("\u0662"), "nvidia.com/gpu", id="arabic-indic-digit"),
    pytest.param(_asking("9" * 5000), "nvidia.com/gpu", id="5000-digit-count"),
    pytest.param(_asking("100000", MIG), MIG, id="mig-count-past-the-gang-limit"),
    pytest.param(_asking("9" * 5000, MIG), MIG, id="mig-5000-digit-count"),
    pytest.param(_asking("1", "nvidia.com/mig-"), "nvidia.com/mig-", id="mig-no-profile"),
    pytest.param(_asking("1", "nvidia.com/mig-" + "x" * 100), "nvidia.com/mig-x", id="mig-long"),
    pytest.param(_asking("1", MIG + "\u0000"), MIG, id="mig-profile-nul"),
    pytest.param(
        pod("odd-1", 1, annotations={"gpu.request.count": "\u00b9"}),
        "gpu.request.count",
        id="count-annotation-superscript",
    ),
    pytest.param(
        pod("odd-2", 1, annotations={"topoplace.io/gang": "g", "topoplace.io/gang-size": "\u00b2"}),
        "topoplace.io/gang-size",
        id="gang-size-superscript",
    ),
    pytest.param(
        pod(
            "odd-3", 1, annotations={"topoplace.io/gang": "g", "topoplace.io/gang-size": "9" * 5000}
        ),
        "topoplace.io/gang-size",
        id="gang-size-5000-digits",
    ),
]


def _post(client: TestClient, verb: str, body: dict[str, Any]) -> Any:
    response = client.post(f"/k8s/v1/{verb}", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _next_pod_is_placed(client: TestClient) -> None:
    fine = pod("fine-0", 2)
    assert _post(client, "filter", names_args(fine, ["a", "b"]))["NodeNames"] == ["a", "b"]


@pytest.mark.parametrize(("odd", "named"), ODD_RESOURCES)
def test_an_odd_request_is_unresolvable_everywhere(
    k8s_client: TestClient, odd: dict[str, Any], named: str
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "a"), ("hgx-h100", "b"))
    answer = _post(k8s_client, "filter", names_args(odd, ["a", "b"]))
    assert answer["NodeNames"] == []
    assert set(answer["FailedAndUnresolvableNodes"]) == {"a", "b"}
    assert named in answer["FailedAndUnresolvableNodes"]["a"]
    scores = _post(k8s_client, "prioritize", names_args(odd, ["a", "b"]))
    assert [s["Score"] for s in scores] == [0, 0]
    victims = {"a": {"Pods": [{"UID": "v"}], "NumPDBViolations": 0}}
    kept = _post(k8s_client, "preempt", {"Pod": odd, "NodeNameToMetaVictims": victims})
    assert kept["NodeNameToMetaVictims"] == {}
    _next_pod_is_placed(k8s_client)


def _gang(name: str) -> dict[str, str]:
    return {"topoplace.io/gang": name, "topoplace.io/gang-size": "2"}


LONG_IDENTITIES = [
    pytest.param(pod("n" * 250, 1), "metadata.name", id="name"),
    pytest.param(pod("p", 1, namespace="s" * 250), "metadata.namespace", id="namespace"),
    pytest.param(pod("p", 1, uid="u" * 300), "metadata.uid", id="uid"),
    pytest.param(pod("p", 1, annotations=_gang("g" * 300)), "topoplace.io/gang", id="gang"),
    pytest.param(pod("p", 1, annotations=_gang("g\u0000")), "topoplace.io/gang", id="gang-nul"),
]


@pytest.mark.parametrize(("odd", "named"), LONG_IDENTITIES)
def test_a_pod_whose_reservation_cannot_name_it_is_refused_before_bind(
    k8s_client: TestClient, kube: FakeKubeApi, odd: dict[str, Any], named: str
) -> None:
    """The reservation's job id, owner and keys are built from the pod's namespace, name,
    UID and gang: one they cannot hold is refused at filter, and at bind (a bind for a
    pod this replica never filtered reads it from the API server) in the Error field."""
    add_nodes(k8s_client, ("hgx-h100", "a"), ("hgx-h100", "b"))
    kube.add(odd)
    answer = _post(k8s_client, "filter", names_args(odd, ["a", "b"]))
    assert answer["NodeNames"] == []
    assert named in answer["FailedAndUnresolvableNodes"]["a"]
    error = _post(k8s_client, "bind", binding_args(odd, "a"))["Error"]
    assert error.startswith("topoplace: ") and named in error
    assert k8s_client.get("/v1/allocations").json()["allocations"] == []
    _next_pod_is_placed(k8s_client)


def test_a_bind_to_a_node_name_no_node_can_have_is_a_bad_request(
    k8s_client: TestClient, kube: FakeKubeApi
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "a"))
    p = kube.add(pod("p", 1))
    _post(k8s_client, "filter", names_args(p, ["a"]))
    response = k8s_client.post("/k8s/v1/bind", json=binding_args(p, "n" * 254))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_request"
    assert _post(k8s_client, "bind", binding_args(p, "a"))["Error"] == ""


@pytest.mark.parametrize(
    "annotations",
    [
        {"topoplace.io/locality": "x" * 100_000},
        {"topoplace.io/locality": "any", "gpu.request.locality": "x" * 100_000},
        {"gpu.request.count": "7" * 100_000},
        {"topoplace.io/gang": "g" * 100_000},
    ],
    ids=["locality", "disagreeing-alias", "count", "gang-without-size"],
)
def test_a_refusal_quotes_a_long_value_shortened(
    k8s_client: TestClient, annotations: dict[str, str]
) -> None:
    """The refusal is repeated for every candidate node: quoting a 100 kB annotation in
    full made a 2,000-node filter's answer 200 MB."""
    names = [f"n{i}" for i in range(200)]
    response = k8s_client.post(
        "/k8s/v1/filter", json=names_args(pod("p", 1, annotations=annotations), names)
    )
    assert response.status_code == 200, response.text
    unresolvable = response.json()["FailedAndUnresolvableNodes"]
    assert set(unresolvable) == set(names)
    assert len(response.content) < 200 * 400, unresolvable["n0"][:300]
