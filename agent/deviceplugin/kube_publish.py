"""Keeping the node's NodeResourceTopology object in the API server (in-cluster account).

Create it when missing, replace it when it changed (with the
resourceVersion read, so a concurrent writer is not overwritten blindly).
Needs ``get``, ``create`` and ``update`` on ``noderesourcetopologies``
(integrations/kubernetes/rbac.yaml, the device plugin's account).
"""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path
from typing import Any

import httpx

from agent.deviceplugin.topology_object import API_VERSION, PLURAL

log = logging.getLogger("topoplace.deviceplugin")
ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class PublishError(RuntimeError):
    pass


class TopologyPublisher:
    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self._last: dict[str, Any] | None = None

    @classmethod
    def in_cluster(cls, timeout_s: float = 5.0) -> TopologyPublisher:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (ACCOUNT / "token").exists():
            raise PublishError(
                "not in a cluster (no KUBERNETES_SERVICE_HOST or service-account token):"
                " run without --publish-topology"
            )
        host = f"[{host}]" if ":" in host else host
        token = (ACCOUNT / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(ACCOUNT / "ca.crt"))
        http = httpx.Client(
            base_url=f"https://{host}:{port}",
            headers={"Authorization": f"Bearer {token}"},
            verify=context,
            timeout=timeout_s,
        )
        return cls(http)

    def publish(self, body: dict[str, Any]) -> bool:
        """Make the stored object ``body``; False when it was already so (nothing sent)."""
        if body == self._last:
            return False
        name = body["metadata"]["name"]
        path = f"/apis/{API_VERSION}/{PLURAL}/{name}"
        try:
            current = self.http.get(path)
            if current.status_code == 404:
                answer = self.http.post(f"/apis/{API_VERSION}/{PLURAL}", json=body)
            elif current.status_code == 200:
                version = current.json().get("metadata", {}).get("resourceVersion")
                meta = {**body["metadata"], "resourceVersion": version}
                answer = self.http.put(path, json={**body, "metadata": meta})
            else:
                raise PublishError(f"GET {path}: {current.status_code} {current.text[:200]}")
        except httpx.HTTPError as exc:
            raise PublishError(f"the API server did not answer: {exc}") from None
        if answer.status_code not in (200, 201):
            raise PublishError(
                f"{answer.request.method} {path}: {answer.status_code} {answer.text[:200]}"
            )
        self._last = body
        return True
