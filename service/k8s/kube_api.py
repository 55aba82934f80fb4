"""The Kubernetes API, as far as the extender needs it: bind a pod, read pods.

:class:`KubeApi` is the port; :class:`HttpKubeApi` talks to a real API server
with httpx, authenticated by the pod's service account (in-cluster) or a
kubeconfig file. Tests use an in-memory fake and a fake API server on
loopback. What it needs from RBAC: ``create`` on ``pods/binding`` and
``get``/``list``/``watch`` on ``pods``, ``patch`` on ``nodes`` (see
integrations/kubernetes/rbac.yaml).

:class:`PodStream` is the asynchronous side the pod watch and the wake-up
use: a paged list of every pod with the list's resourceVersion, a watch from
that version (newline-separated JSON events over one long response), and a
merge patch of a Node's labels.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import httpx
import yaml

from service.k8s.binding_post import Answer, BindingPoster
from service.k8s.wire import Pod

log = logging.getLogger("topoplace.k8s")

# Everything this client asks of the API server, as RBAC rules: the ClusterRole in
# integrations/kubernetes/rbac.yaml grants exactly these (a test holds them equal).
RBAC_RULES = (
    ("", "pods/binding", ("create",)),  # bind
    ("", "pods", ("get", "list", "watch")),  # bind, the reconciler, the pod watch
    ("", "nodes", ("patch",)),  # the wake-up label on GPU nodes
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


class WatchExpired(KubeApiError):
    """410 Gone: the resourceVersion a watch asked for is compacted away; list again."""


class WatchBroken(KubeApiError):
    """The watch's stream ended mid-way (a proxy, a restart of the API server): resume it."""


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


class PodStream(Protocol):
    async def list_all(self) -> tuple[list[Pod], str]:
        """Every pod, finished ones too, and the list's resourceVersion."""

    def watch(
        self, resource_version: str, opened: Callable[[], None]
    ) -> AsyncIterator[dict[str, Any]]:
        """The pod events after ``resource_version`` (BOOKMARKs included) until the server
        ends the stream; ``opened`` is called once the server accepted the watch.
        WatchExpired on 410, WatchBroken when the stream breaks off, KubeApiError else."""

    async def label_node(self, name: str, key: str, value: str) -> bool:
        """Merge-patch one label onto a Node; False when there is no such Node."""

    async def aclose(self) -> None: ...


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


def _binding(
    namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
) -> tuple[str, bytes]:
    """The Binding POST's path and body."""
    path = f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}/binding"
    return path, json.dumps(binding_body(namespace, name, uid, node, annotations)).encode()


def _check_bound(answer: Answer) -> None:
    """KubeApiError with the API server's message unless the Binding was made."""
    if answer.status not in (200, 201):
        raise KubeApiError(answer.status, status_message(answer.body, answer.reason))


def _message(response: httpx.Response) -> str:
    return status_message(response.content, response.reason_phrase)


def status_message(content: bytes, reason: str) -> str:
    """The API server's Status message; else the start of the body; else the reason."""
    text = content.decode("utf-8", "replace")
    try:
        body = json.loads(text)
    except ValueError:
        return text[:300] or reason
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return text[:300]


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
        self._server, self._verify, self._timeout_s = server.rstrip("/"), verify, timeout_s
        self._client = httpx.Client(base_url=self._server, verify=verify, timeout=timeout_s)
        self._binder = BindingPoster(self._server, verify, timeout_s)

    def stream(self) -> HttpPodStream:
        """A client for the pod watch and the wake-up, on the caller's event loop."""
        return HttpPodStream(self._server, self._token, self._verify, self._timeout_s)

    def close(self) -> None:
        self._client.close()
        self._binder.close()

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._client.request(method, path, headers=self._headers(), **kwargs)
        except httpx.HTTPError as exc:
            raise KubeApiError(0, f"the Kubernetes API did not answer: {exc}") from None

    def bind(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        path, body = _binding(namespace, name, uid, node, annotations)
        try:
            answer = self._binder.post(path, body, self._headers())
        except (OSError, http.client.HTTPException) as exc:
            raise KubeApiError(0, f"the Kubernetes API did not answer: {exc!r}") from None
        _check_bound(answer)

    async def bind_async(
        self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]
    ) -> None:
        """``bind`` on the running event loop (service/k8s/binding_post.py)."""
        path, body = _binding(namespace, name, uid, node, annotations)
        try:
            answer = await self._binder.post_async(path, body, self._headers())
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            raise KubeApiError(0, f"the Kubernetes API did not answer: {exc!r}") from None
        _check_bound(answer)

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


WATCH_TIMEOUT_S = 300  # the server ends each watch after this; it is resumed at once


class HttpPodStream:
    def __init__(
        self,
        server: str,
        token: Callable[[], str | None],
        verify: ssl.SSLContext | bool,
        timeout_s: float,
    ) -> None:
        self._token = token
        # A watch is silent between events (bookmarks come about once a minute), so its
        # reads wait for as long as the server keeps the watch open.
        timeout = httpx.Timeout(timeout_s, read=WATCH_TIMEOUT_S + timeout_s)
        self._client = httpx.AsyncClient(base_url=server, verify=verify, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return headers

    async def list_all(self) -> tuple[list[Pod], str]:
        params = {"limit": str(LIST_PAGE)}
        pods: list[Pod] = []
        version = ""
        while True:
            try:
                response = await self._client.get(
                    "/api/v1/pods", params=params, headers=self._headers()
                )
            except httpx.HTTPError as exc:
                raise KubeApiError(0, f"the Kubernetes API did not answer: {exc}") from None
            if response.status_code != 200:
                raise KubeApiError(response.status_code, _message(response))
            body = response.json()
            meta = body.get("metadata") or {}
            version = version or str(meta.get("resourceVersion") or "")
            pods += body.get("items") or []
            if not meta.get("continue"):
                return pods, version
            params["continue"] = meta["continue"]

    async def watch(
        self, resource_version: str, opened: Callable[[], None]
    ) -> AsyncIterator[dict[str, Any]]:
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        request = self._client.build_request(
            "GET", "/api/v1/pods", params=params, headers=self._headers()
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise KubeApiError(0, f"the Kubernetes API did not answer: {exc}") from None
        try:
            if response.status_code != 200:
                await response.aread()
                raise KubeApiError(response.status_code, _message(response))
            opened()
            async for line in response.aiter_lines():
                if not line.strip():
                    continue
                event = json.loads(line)
                if not isinstance(event, dict):  # resent on each resume: passed over
                    log.warning("the pod watch sent something not an event: %.200s", line)
                    continue
                if event.get("type") == "ERROR":
                    status = event.get("object")
                    status = status if isinstance(status, dict) else {}
                    code = int(status.get("code") or 0)
                    message = str(status.get("message") or "watch error")
                    raise (WatchExpired if code == 410 else KubeApiError)(code, message)
                yield event
        except httpx.HTTPError as exc:
            raise WatchBroken(0, f"the pod watch broke off: {exc}") from None
        except ValueError as exc:
            raise KubeApiError(0, f"the pod watch sent something that is not JSON: {exc}") from None
        finally:
            await response.aclose()

    async def label_node(self, name: str, key: str, value: str) -> bool:
        headers = {**self._headers(), "Content-Type": "application/merge-patch+json"}
        body = json.dumps({"metadata": {"labels": {key: value}}})
        try:
            response = await self._client.patch(
                f"/api/v1/nodes/{quote(name)}", content=body, headers=headers
            )
        except httpx.HTTPError as exc:
            raise KubeApiError(0, f"the Kubernetes API did not answer: {exc}") from None
        if response.status_code == 404:
            return False
        if response.status_code != 200:
            raise KubeApiError(response.status_code, _message(response))
        return True

    async def aclose(self) -> None:
        await asyncio.shield(self._client.aclose())


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
