"""An in-memory Kubernetes API with the behaviour the extender relies on."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from service.k8s.kube_api import KubeApiError, binding_body


class FakeKubeApi:
    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.refuse_with: KubeApiError | None = None

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        meta = pod["metadata"]
        self.pods[(meta["namespace"], meta["name"])] = copy.deepcopy(pod)
        return pod

    def start(self, namespace: str, name: str, at: datetime | None = None) -> None:
        """The pod's kubelet admitted and started it: ``status.startTime``, in whole
        seconds as the API server writes times (now, by default)."""
        when = (at or datetime.now(UTC)).astimezone(UTC)
        status = self.pods[(namespace, name)].setdefault("status", {})
        status["startTime"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")

    def delete(self, namespace: str, name: str) -> None:
        del self.pods[(namespace, name)]

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        if self.refuse_with is not None:
            raise self.refuse_with
        pod = self.pods.get((namespace, name))
        if pod is None:
            raise KubeApiError(404, f'pods "{name}" not found')
        if uid and pod["metadata"]["uid"] != uid:
            raise KubeApiError(409, "Precondition failed: UID in precondition")
        if pod["spec"].get("nodeName"):
            raise KubeApiError(409, f"pod {name} is already assigned to node")
        self.bindings.append(binding_body(namespace, name, uid, node, annotations))
        pod["spec"]["nodeName"] = node
        pod["metadata"].setdefault("annotations", {}).update(annotations)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = self.pods.get((namespace, name))
        return copy.deepcopy(pod) if pod is not None else None

    def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(p)
            for (ns, _), p in self.pods.items()
            if (namespace is None or ns == namespace)
            and p.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        ]
