"""GPUs of sidecar init containers (``restartPolicy: Always``) are held beside the app's.

The kubelet's device manager keeps a sidecar's devices for the pod's whole life (they
are not handed on to the app containers as a plain init container's are), and
kube-scheduler counts a pod's extended resources as it counts CPU: the sidecars add
to the containers' sum, and each init container needs its own plus the sidecars
started before it. A pod counted smaller than that is reserved fewer GPUs than the
kubelet gives it.
"""

from __future__ import annotations

from typing import Any

import pytest

from service.k8s.pod_request import device_counts, parse_pod

GPU = "nvidia.com/gpu"


def _container(name: str, gpus: int, sidecar: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "resources": {"limits": {GPU: str(gpus)}}}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


@pytest.mark.parametrize(
    ("init", "containers", "expected"),
    [
        pytest.param([_container("side", 1, True)], [_container("app", 1)], 2, id="sidecar"),
        pytest.param(
            [_container("side", 1, True), _container("setup", 2)],
            [_container("app", 1)],
            # setup runs beside the sidecar (2 + 1); afterwards app and sidecar (1 + 1).
            3,
            id="init-after-sidecar",
        ),
        pytest.param(
            [_container("setup", 2), _container("side", 1, True)],
            [_container("app", 1)],
            # setup runs before the sidecar starts: 2; then app beside the sidecar: 2.
            2,
            id="init-before-sidecar",
        ),
        pytest.param([_container("setup", 3)], [_container("app", 1)], 3, id="plain-init"),
    ],
)
def test_sidecar_gpus_add_to_the_pod(
    init: list[dict[str, Any]], containers: list[dict[str, Any]], expected: int
) -> None:
    spec = {"initContainers": init, "containers": containers}
    assert device_counts(spec) == {GPU: expected}
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}, "spec": spec}
    request = parse_pod(pod).request
    assert request is not None and request.gpus == expected
