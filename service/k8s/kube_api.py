"""The Kubernetes API, as far as the extender needs it: bind a pod, read pods.

:class:`KubeApi` is the port; :class:`HttpKubeApi` talks to a real API server
with httpx, authenticated by the pod's service account (in-cluster) or a
kubeconfig file. Tests use an in-memory fake and a fake API server on
loopback. What it needs from RBAC: ``create`` on ``pods/binding`` and
``get``/``list`` on ``pods`` (see integrations/kubernetes/rbac.yaml).
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import httpx
import yaml

from service.k8s.wire import Pod

# Everything this client asks of the API server, as RBAC rules: the ClusterRole in
# integrations/kubernetes/rbac.yaml grants exactly these (a test holds them equal).
RBAC_RULES = (
    ("", "pods/binding", ("create",)),  # bind
    ("", "pods", ("get", "list")),  # bind (a pod filter did not see), the reconciler
)
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S = 60.0  # projected service-account tokens rotate; re-read them now and then
LIST_PAGE = 500


class KubeApiError(Exception):
    """The API server refused or did not answer; ``status`` 0 when it did not answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class KubeConfigError(ValueError):
    """No usable way to reach the API server (no in-cluster account, a bad kubeconfig)."""


class KubeApi(Protocol):
    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        """Create the pod's Binding to ``node``; annotations are copied onto the pod."""

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        """The pod, or None when it does not exist."""

    def list_pods(self, namespace: str | None = None) -> list[Pod]:
        """Every pod (in one namespace, or all) that has not finished."""


def binding_body(
    namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations}
    if uid:
        metadata["uid"] = uid  # the API server then binds only this incarnation of the pod
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": metadata,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node},
    }


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return response.text[:300]


class HttpKubeApi:
    def __init__(
        self,
        server: str,
        *,
        token: Callable[[], str | None] = lambda: None,
        verify: ssl.SSLContext | bool = True,
        timeout_s: float = 5.0,
    ) -> None:
        self._token = token
        self._client = httpx.Client(base_url=server.rstrip("/"), verify=verify, timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        headers = {"Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            return self._client.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise KubeApiError(0, f"the Kubernetes API did not answer: {exc}") from None

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding"
        body = binding_body(namespace, name, uid, node, annotations)
        response = self._request("POST", path, json=body)
        if response.status_code not in (200, 201):
            raise KubeApiError(response.status_code, _message(response))

    def get_pod(self, namespace: str, name: str) -> Pod | None:
        response = self._request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise KubeApiError(response.status_code, _message(response))
        pod: Pod = response.json()
        return pod

    def list_pods(self, namespace: str | None = None) -> list[Pod]:
        path = f"/api/v1/namespaces/{quote(namespace)}/pods" if namespace else "/api/v1/pods"
        params = {
            "fieldSelector": "status.phase!=Succeeded,status.phase!=Failed",
            "limit": str(LIST_PAGE),
        }
        pods: list[Pod] = []
        while True:
            response = self._request("GET", path, params=params)
            if response.status_code != 200:
                raise KubeApiError(response.status_code, _message(response))
            body = response.json()
            pods += body.get("items") or []
            more = (body.get("metadata") or {}).get("continue")
            if not more:
                return pods
            params["continue"] = more


class _FileToken:
    """A token file read again every minute: kubelet rotates projected tokens in place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._value: str | None = None
        self._read_at = 0.0

    def __call__(self) -> str | None:
        with self._lock:
            now = time.monotonic()
            if self._value is None or now - self._read_at > TOKEN_REREAD_S:
                self._value = self.path.read_text(encoding="utf-8").strip()
                self._read_at = now
            return self._value


def in_cluster(timeout_s: float = 5.0) -> HttpKubeApi:
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    token_path = SERVICE_ACCOUNT_DIR / "token"
    if not host or not token_path.exists():
        raise KubeConfigError(
            "not running in a cluster (no KUBERNETES_SERVICE_HOST or service-account token);"
            " set TOPOPLACE_K8S_KUBECONFIG"
        )
    host = f"[{host}]" if ":" in host else host
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT_DIR / "ca.crt"))
    return HttpKubeApi(
        f"https://{host}:{port}", token=_FileToken(token_path), verify=context, timeout_s=timeout_s
    )


def _named(items: Any, name: str, kind: str, path: Path) -> dict[str, Any]:
    for item in items or ():
        if item.get("name") == name:
            found: dict[str, Any] = item.get(kind) or {}
            return found
    raise KubeConfigError(f"kubeconfig {path}: no {kind} named {name!r}")


def _data_file(data: str, directory: Path, name: str) -> str:
    target = directory / name
    target.write_bytes(base64.b64decode(data))
    target.chmod(0o600)
    return str(target)


def from_kubeconfig(path: Path, timeout_s: float = 5.0) -> HttpKubeApi:
    """The current context of a kubeconfig: server, CA, and a token or client certificate."""
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc}") from None
    context_name = config.get("current-context")
    if not context_name:
        raise KubeConfigError(f"kubeconfig {path} has no current-context")
    context = _named(config.get("contexts"), context_name, "context", path)
    cluster = _named(config.get("clusters"), context.get("cluster", ""), "cluster", path)
    user = (
        _named(config.get("users"), context.get("user", ""), "user", path)
        if context.get("user")
        else {}
    )
    server = cluster.get("server")
    if not server:
        raise KubeConfigError(
            f"kubeconfig {path}: cluster {context.get('cluster')!r} has no server"
        )
    base = path.parent
    verify: ssl.SSLContext | bool = True
    if server.startswith("https"):
        if cluster.get("insecure-skip-tls-verify"):
            verify = False
        else:
            ca_data = cluster.get("certificate-authority-data")
            ca_file = cluster.get("certificate-authority")
            ssl_context = ssl.create_default_context(
                cadata=base64.b64decode(ca_data).decode() if ca_data else None,
                cafile=str(base / ca_file) if ca_file else None,
            )
            cert, key = user.get("client-certificate"), user.get("client-key")
            if user.get("client-certificate-data"):
                keep = Path(tempfile.mkdtemp(prefix="topoplace-kube-"))
                cert = _data_file(user["client-certificate-data"], keep, "client.crt")
                key = _data_file(user.get("client-key-data", ""), keep, "client.key")
            if cert:
                ssl_context.load_cert_chain(str(base / cert), str(base / key) if key else None)
            verify = ssl_context
    token: Callable[[], str | None]
    if user.get("token"):
        fixed = str(user["token"])
        token = lambda: fixed  # noqa: E731
    elif user.get("tokenFile"):
        token = _FileToken(base / user["tokenFile"])
    else:
        token = lambda: None  # noqa: E731
    return HttpKubeApi(str(server), token=token, verify=verify, timeout_s=timeout_s)
