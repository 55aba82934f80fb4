"""The Kubernetes API calls the extender makes are timed by call and outcome."""

from __future__ import annotations

import pytest

from service.k8s.kube_api import KubeApiError
from service.k8s.timed_api import TimedKubeApi
from service.k8s.wire import Pod
from service.metrics.registry import Metrics


class Answers:
    """A Kubernetes API whose every call fails with ``error`` when one is set."""

    def __init__(self) -> None:
        self.error: KubeApiError | None = None
        self.bound: list[str] = []

    def _maybe_fail(self) -> None:
        if self.error is not None:
            raise self.error

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        self._maybe_fail()
        self.bound.append(f"{namespace}/{name}@{node}")

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        self._maybe_fail()
        return None

    def list_pods(self, namespace: str | None = None) -> list[Pod]:
        self._maybe_fail()
        return []


def _count(metrics: Metrics, call: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "topoplace_kube_api_request_duration_seconds_count", {"call": call, "outcome": outcome}
    )
    return value or 0.0


def test_calls_pass_through_and_are_counted_by_outcome() -> None:
    metrics, api = Metrics(), Answers()
    timed = TimedKubeApi(api, metrics.kube_api)
    timed.bind("ns", "p", "uid-1", "n1", {})
    assert api.bound == ["ns/p@n1"]
    assert timed.get_pod("ns", "p") is None and timed.list_pods() == []
    api.error = KubeApiError(409, "conflict")
    with pytest.raises(KubeApiError):
        timed.bind("ns", "p", "uid-1", "n1", {})
    api.error = KubeApiError(0, "the Kubernetes API did not answer")
    with pytest.raises(KubeApiError):
        timed.list_pods()
    assert _count(metrics, "bind", "ok") == 1 and _count(metrics, "bind", "409") == 1
    assert _count(metrics, "get_pod", "ok") == 1
    assert _count(metrics, "list_pods", "ok") == 1
    assert _count(metrics, "list_pods", "unreachable") == 1
