"""A GPU pod's CPU and memory requests as the engine's host figures, computed as
kube-scheduler computes a pod's effective request."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.k8s_objects import names_args, pod
from service.k8s.pod_request import BadPodRequest, parse_pod
from tests.service.helpers import add_nodes

GIB = 1024


def _pod(*containers: dict[str, Any], gpus: int = 1, **spec: Any) -> dict[str, Any]:
    """A pod asking ``gpus`` GPUs in its first container, whose containers request the
    given CPU and memory (each a ``{"cpu": ..., "memory": ...}`` of requests)."""
    body = pod("p", gpus)
    body["spec"]["containers"] = [
        {"name": f"c{i}", "resources": {"requests": dict(asked)}}
        for i, asked in enumerate(containers)
    ]
    first = body["spec"]["containers"][0]["resources"]
    first["requests"]["nvidia.com/gpu"] = str(gpus)
    first["limits"] = {"nvidia.com/gpu": str(gpus)}
    body["spec"].update(spec)
    return body


def _figures(body: dict[str, Any]) -> tuple[int | None, int | None]:
    request = parse_pod(body).request
    assert request is not None
    return request.cpu_milli, request.memory_mib


def _init(name: str, asked: dict[str, str], sidecar: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "resources": {"requests": asked}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


@pytest.mark.parametrize(
    ("body", "figures"),
    [
        pytest.param(_pod({"cpu": "500m", "memory": "1Gi"}), (500, GIB), id="one-container"),
        pytest.param(
            _pod({"cpu": "1.5", "memory": "512Mi"}, {"cpu": "250m", "memory": "129e6"}),
            (1750, 512 + 124),  # summed exactly, then rounded up to MiB
            id="containers-summed",
        ),
        pytest.param(
            _pod({"cpu": "1", "memory": "1Gi"}, initContainers=[_init("i", {"cpu": "4"})]),
            (4000, GIB),  # an init container needing more CPU: its figure, memory the sum
            id="init-larger",
        ),
        pytest.param(
            _pod({"cpu": "2"}, initContainers=[_init("i", {"cpu": "1", "memory": "64Mi"})]),
            (2000, 64),
            id="init-smaller",
        ),
        pytest.param(
            _pod(
                {"cpu": "1"},
                initContainers=[
                    _init("side", {"cpu": "500m"}, sidecar=True),
                    _init("setup", {"cpu": "1"}),
                ],
            ),
            # The sidecar runs beside the containers (1 + 0.5) and beside the later init
            # container (1 + 0.5): kube-scheduler's rule for restartable init containers.
            (1500, None),
            id="sidecar",
        ),
        pytest.param(
            _pod(
                {"cpu": "1"}, initContainers=[_init("setup", {"cpu": "2"})], overhead={"cpu": "1"}
            ),
            (3000, None),  # the overhead is added to the larger of the two
            id="overhead-after-init",
        ),
        pytest.param(
            _pod({"cpu": "1", "memory": "1Gi"}, overhead={"cpu": "250m", "memory": "120Mi"}),
            (1250, GIB + 120),
            id="overhead",
        ),
        pytest.param(
            _pod({"cpu": "1"}, resources={"requests": {"cpu": "3"}}),
            (3000, None),  # pod-level resources replace the containers' figures
            id="pod-level",
        ),
        pytest.param(_pod({}), (None, None), id="no-requests"),
        pytest.param(_pod({"cpu": "0"}), (0, None), id="zero-is-sent"),
    ],
)
def test_effective_requests(body: dict[str, Any], figures: tuple[int | None, int | None]) -> None:
    assert _figures(body) == figures


def test_a_limit_without_a_request_is_the_request() -> None:
    # The API server's defaulting: a pod not read from one is counted the same.
    body = _pod({})
    body["spec"]["containers"][0]["resources"]["limits"].update(cpu="2", memory="1G")
    assert _figures(body) == (2000, 954)


def test_a_pod_without_gpus_sends_nothing_even_with_bad_quantities() -> None:
    body = _pod({"cpu": "lots"})
    body["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "lots"}}
    assert parse_pod(body).request is None


def test_a_gang_member_sends_its_own_figures_per_task() -> None:
    notes = {"topoplace.io/gang": "g", "topoplace.io/gang-size": "4"}
    body = _pod({"cpu": "6", "memory": "32Gi"}, gpus=2)
    body["metadata"]["annotations"] = notes
    member = parse_pod(body)
    gang = member.gang_request()
    assert (gang.tasks, gang.gpus, gang.cpu_milli, gang.memory_mib) == (4, 2, 6000, 32 * GIB)


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (_pod({"cpu": "fast"}), "container 'c0' resource cpu: 'fast' is not a quantity"),
        (_pod({"memory": "1GB"}), "container 'c0' resource memory: '1GB' has an unknown suffix"),
        (_pod({"cpu": "-1"}), "resource cpu: '-1' is negative"),
        (_pod({}, overhead={"memory": "x"}), "spec overhead resource memory"),
        (_pod({}, initContainers=[_init("i", {"cpu": "1 "})]), "container 'i' resource cpu"),
        (_pod({}, resources={"requests": {"cpu": True}}), "spec resource cpu: True"),
        (_pod({"cpu": "3e6"}), "more than topoplace counts"),
        (_pod({"memory": "3Pi"}), "more than topoplace counts"),
        (_pod({}, overhead=[]), "spec overhead must be an object"),
        (_pod({}, initContainers={}), "spec initContainers must be a list"),
    ],
)
def test_a_bad_quantity_is_refused_naming_where(body: dict[str, Any], named: str) -> None:
    with pytest.raises(BadPodRequest) as caught:
        parse_pod(body)
    assert named in str(caught.value), caught.value


def test_a_bad_quantity_fails_the_filter_as_unresolvable_and_the_next_pod_goes_on(
    k8s_client: TestClient,
) -> None:
    add_nodes(k8s_client, ("hgx-h100", "a"), ("hgx-h100", "b"))
    odd = _pod({"cpu": "1", "memory": "9Zi"})
    answer = k8s_client.post("/k8s/v1/filter", json=names_args(odd, ["a", "b"])).json()
    assert answer["NodeNames"] == []
    message = answer["FailedAndUnresolvableNodes"]["a"]
    assert message.startswith("topoplace: ") and "resource memory: '9Zi'" in message
    fine = k8s_client.post("/k8s/v1/filter", json=names_args(pod("fine", 1), ["a", "b"]))
    assert fine.json()["NodeNames"] == ["a", "b"]
