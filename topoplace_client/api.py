"""A typed client for the topoplace service's HTTP API (``/v1``, see docs/service.md).

Every method returns the service's JSON as parsed (dicts), unchanged, so
callers see exactly what the API documents. Two kinds of failure are kept
apart because callers react to them differently:

- ``ApiError``: the service answered and said no (its ``{"error": {...}}``
  shape: a stable ``code`` to switch on, a ``message`` for people), or something
  answered with a redirect (code ``redirected``, the Location in ``detail``);
- ``ServiceUnreachable`` (a ``ConnectionError``): no answer at all, so
  nothing is known about the request's fate.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote, urlsplit

import httpx

DEFAULT_TIMEOUT_S = 10.0

JSONObject = dict[str, Any]


class ApiError(Exception):
    """The service answered with an error status."""

    def __init__(
        self,
        code: str,
        message: str,
        status: int,
        detail: Mapping[str, Any] | None = None,
        body: JSONObject | None = None,
        retry_after: str | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status
        self.detail: JSONObject = dict(detail or {})
        # The answer as sent, when it was JSON, so `--json` can pass it on untouched.
        self.body = body
        # The answer's Retry-After header as sent (seconds or an HTTP-date), if any: a
        # caller that retries waits at least that long instead of adding to the load.
        self.retry_after = retry_after

    @property
    def try_later(self) -> bool:
        """Whether the same request may succeed later: the service failed (5xx) or is rate
        limiting the caller (429). Anything else is a refusal a retry cannot mend. The one
        rule by which `topoplace agent --once` and the client commands exit 3."""
        return self.status == 429 or self.status >= 500

    def line(self) -> str:
        """The error in one line for a person: its code and message, and for a try-later
        answer its Retry-After (how long the service asks to be left alone), if it gave one."""
        said = f"{self.code}: {self.message}"
        if self.try_later and self.retry_after is not None:
            said += f"; try again later (Retry-After: {self.retry_after})"
        return said

    @classmethod
    def from_response(cls, response: httpx.Response) -> ApiError:
        body = _json_or_none(response)
        retry_after = response.headers.get("Retry-After")
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("code"), str):
            detail = error.get("detail")
            return cls(
                error["code"],
                str(error.get("message") or ""),
                response.status_code,
                detail if isinstance(detail, dict) else None,
                body if isinstance(body, dict) else None,
                retry_after,
            )
        # Not the service's shape: a proxy in between, or something other than
        # topoplace listening at that address. Say what came back instead.
        text = " ".join(response.text.split())[:200]
        answer = f"{response.request.url} answered {response.status_code} {response.reason_phrase}"
        return cls(
            f"http_{response.status_code}",
            f"{answer}: {text}" if text else answer,
            response.status_code,
            None,
            body if isinstance(body, dict) else None,
            retry_after,
        )

    @classmethod
    def redirected(cls, response: httpx.Response) -> ApiError:
        """A 3xx answer: the request went nowhere (the client follows no redirect, which
        would resend a signed body or a token to wherever a proxy points)."""
        location = response.headers.get("Location")
        request = response.request
        answer = f"{request.method} {request.url} answered {response.status_code}"
        answer += f" {response.reason_phrase}"
        where = f" to {location}" if location else " without a Location"
        return cls(
            "redirected",
            f"{answer}{where}: nothing was delivered; if that is the service, make it the"
            " server URL",
            response.status_code,
            {"location": location} if location else None,
        )


class ServiceUnreachable(ConnectionError):
    """No answer from the service: refused, unresolvable host, TLS failure or timeout."""

    def __init__(self, server: str, reason: str) -> None:
        super().__init__(f"cannot reach topoplace at {server}: {reason}")
        self.server = server
        self.reason = reason


def normalize_server_url(url: str) -> str:
    """``host:port`` becomes ``http://host:port``; anything but http(s) is refused."""
    url = url.strip()
    if "://" not in url:
        url = f"http://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{url!r} is not an http:// or https:// URL")
    return url.rstrip("/")


def tls_context(ca_bundle: str) -> ssl.SSLContext:
    """A client context trusting only the CAs in ``ca_bundle`` (certificate and host name
    verified); ValueError naming the file when it cannot be read."""
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot read the CA bundle {ca_bundle}: {exc}") from None


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _segment(value: str) -> str:
    # Names and ids are user input: a space or '?' must stay inside its path segment.
    return quote(value, safe="")


class TopoplaceClient:
    """One method per endpoint of the service; use as a context manager or call ``close``."""

    def __init__(
        self,
        server: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        token: str | None = None,
        ca_bundle: str | None = None,
    ) -> None:
        """``ca_bundle``: a PEM file of the certificate authorities an https service's
        certificate must chain to (default: the system's); the host name is checked too."""
        self.server = normalize_server_url(server)
        self.timeout = timeout
        if transport is None and self.server.startswith("http://"):
            # Plain HTTP never uses TLS, so skip loading the CA bundle: it takes
            # tens of milliseconds, a noticeable share of a command's run. The
            # empty context still verifies, so it would refuse any TLS peer.
            transport = httpx.HTTPTransport(verify=ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
        elif transport is None and ca_bundle:
            transport = httpx.HTTPTransport(verify=tls_context(ca_bundle))
        headers = {"Authorization": f"Bearer {token}"} if token else None
        self._http = httpx.Client(
            base_url=self.server, timeout=timeout, transport=transport, headers=headers
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def set_token(self, token: str | None) -> None:
        """Send ``token`` from the next request on (a rotated token file re-read)."""
        if token:
            self._http.headers["Authorization"] = f"Bearer {token}"
        else:
            self._http.headers.pop("Authorization", None)

    # -- transport ---------------------------------------------------------

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        try:
            response = self._http.request(method, path, params=params, json=json, headers=headers)
        except httpx.TimeoutException as exc:
            raise ServiceUnreachable(
                self.server, f"no answer within {self.timeout:g} s ({type(exc).__name__})"
            ) from exc
        except httpx.RequestError as exc:
            raise ServiceUnreachable(self.server, str(exc) or type(exc).__name__) from exc
        if response.is_error:
            raise ApiError.from_response(response)
        if 300 <= response.status_code < 400:
            # Not the service's answer: taken as one, a snapshot or heartbeat a proxy
            # redirected (http to https, say) would count as delivered.
            raise ApiError.redirected(response)
        return response

    def _object(self, response: httpx.Response) -> JSONObject:
        data = _json_or_none(response)
        if not isinstance(data, dict):
            raise ApiError(
                "invalid_response",
                f"{response.request.method} {response.request.url} did not answer with a JSON"
                " object; is this a topoplace service?",
                response.status_code,
            )
        return data

    def _get(self, path: str, params: Mapping[str, str | int] | None = None) -> JSONObject:
        return self._object(self._request("GET", path, params=params))

    def _post(
        self, path: str, body: Any = None, headers: Mapping[str, str] | None = None
    ) -> JSONObject:
        return self._object(self._request("POST", path, json=body, headers=headers))

    # -- health ------------------------------------------------------------

    def health(self) -> JSONObject:
        """GET /healthz: the process is up."""
        return self._get("/healthz")

    def ready(self) -> JSONObject:
        """GET /readyz: the database answers and the state is loaded (ApiError 503 if not)."""
        return self._get("/readyz")

    # -- nodes -------------------------------------------------------------

    def nodes(self) -> JSONObject:
        """GET /v1/nodes: ``{"nodes": [...]}``."""
        return self._get("/v1/nodes")

    def node(self, name: str) -> JSONObject:
        """GET /v1/nodes/{name}."""
        return self._get(f"/v1/nodes/{_segment(name)}")

    def topology(self, name: str) -> JSONObject:
        """GET /v1/nodes/{name}/topology: links, bandwidths and ``nvidia-smi topo -m`` text."""
        return self._get(f"/v1/nodes/{_segment(name)}/topology")

    def snapshots(self, name: str) -> list[JSONObject]:
        """GET /v1/nodes/{name}/snapshots: stored snapshot history, newest first."""
        response = self._request("GET", f"/v1/nodes/{_segment(name)}/snapshots")
        data = _json_or_none(response)
        if not isinstance(data, list):
            raise ApiError(
                "invalid_response", "snapshot history is not a JSON list", response.status_code
            )
        return data

    def put_snapshot(
        self, name: str, snapshot: Mapping[str, Any], signature: str | None = None
    ) -> JSONObject:
        """PUT /v1/nodes/{name}/snapshot: report a node's full snapshot."""
        body: JSONObject = {"snapshot": dict(snapshot)}
        if signature is not None:
            body["signature"] = signature
        path = f"/v1/nodes/{_segment(name)}/snapshot"
        response = self._request("PUT", path, json=body)
        answer = self._object(response)
        seq = answer.get("seq")
        if not isinstance(answer.get("node"), str) or not isinstance(seq, int) or seq is True:
            # A success without what the service acknowledges a stored snapshot with: a
            # proxy's or another service's answer, so nothing says the snapshot was kept.
            raise ApiError(
                "invalid_response",
                f"PUT {response.request.url} answered {response.status_code} without the node"
                " and seq a stored snapshot is acknowledged with; is this a topoplace service"
                " (or a proxy answering for it)?",
                response.status_code,
            )
        return answer

    def heartbeat(self, name: str, nvlink: list[dict[str, int]] | None = None) -> None:
        """POST /v1/nodes/{name}/heartbeat (204); ``nvlink``: the node's NVLink counters."""
        body = None if nvlink is None else {"nvlink": nvlink}
        self._request("POST", f"/v1/nodes/{_segment(name)}/heartbeat", json=body)

    def put_node_key(self, name: str, public_key: str, *, replace: bool = False) -> JSONObject:
        """PUT /v1/nodes/{name}/key: register the node's Ed25519 public key (base64);
        ``replace``: replace a different registered key (an admin action)."""
        path = f"/v1/nodes/{_segment(name)}/key"
        body = {"algorithm": "ed25519", "public_key": public_key}
        params = {"replace": "true"} if replace else None
        return self._object(self._request("PUT", path, params=params, json=body))

    def node_key(self, name: str) -> JSONObject:
        """GET /v1/nodes/{name}/key: the registered public key."""
        return self._get(f"/v1/nodes/{_segment(name)}/key")

    def delete_node_key(self, name: str) -> None:
        """DELETE /v1/nodes/{name}/key (204): forget the key so a new one can be registered."""
        self._request("DELETE", f"/v1/nodes/{_segment(name)}/key")

    def cordon(self, name: str) -> JSONObject:
        """POST /v1/nodes/{name}/cordon: take the node out of placement."""
        return self._post(f"/v1/nodes/{_segment(name)}/cordon")

    def uncordon(self, name: str) -> JSONObject:
        """POST /v1/nodes/{name}/uncordon: put the node back."""
        return self._post(f"/v1/nodes/{_segment(name)}/uncordon")

    def delete_node(self, name: str) -> None:
        """DELETE /v1/nodes/{name} (204; 409 while it holds GPUs)."""
        self._request("DELETE", f"/v1/nodes/{_segment(name)}")

    # -- placement and allocations ------------------------------------------

    def place(
        self, request: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> JSONObject:
        """POST /v1/place: choose and reserve; the same key again returns the same allocation."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None
        return self._post("/v1/place", dict(request), headers)

    def score(self, request: Mapping[str, Any]) -> JSONObject:
        """POST /v1/score: rank nodes for a request without reserving."""
        return self._post("/v1/score", dict(request))

    def allocations(
        self,
        *,
        job_id: str | None = None,
        node: str | None = None,
        state: str | None = None,
        limit: int | None = None,
    ) -> JSONObject:
        """GET /v1/allocations with optional filters: ``{"allocations": [...]}``, newest first."""
        params: dict[str, str | int] = {}
        if job_id is not None:
            params["job_id"] = job_id
        if node is not None:
            params["node"] = node
        if state is not None:
            params["state"] = state
        if limit is not None:
            params["limit"] = limit
        return self._get("/v1/allocations", params)

    # -- Kubernetes device plugin ----------------------------------------------

    def k8s_reservations(self, node: str) -> JSONObject:
        """GET /v1/nodes/{name}/k8s/reservations: the node's pod reservations, oldest first."""
        return self._get(f"/v1/nodes/{_segment(node)}/k8s/reservations")

    def k8s_report_devices(
        self,
        node: str,
        resource: str,
        pods: Sequence[Mapping[str, Any]],
        listed_at: datetime | None = None,
    ) -> JSONObject:
        """POST /v1/nodes/{name}/k8s/devices: what the kubelet really gave each pod;
        ``listed_at``: when its List was read (timezone-aware, the node's clock)."""
        body: dict[str, Any] = {"resource": resource, "pods": list(pods)}
        if listed_at is not None:
            body["listed_at"] = listed_at.isoformat()
        return self._post(f"/v1/nodes/{_segment(node)}/k8s/devices", body)

    def k8s_mismatches(self) -> JSONObject:
        """GET /v1/k8s/mismatches: where the kubelet's choice differed from the reservation."""
        return self._get("/v1/k8s/mismatches")

    def allocation(self, allocation_id: str) -> JSONObject:
        """GET /v1/allocations/{id}."""
        return self._get(f"/v1/allocations/{_segment(allocation_id)}")

    def confirm(self, allocation_id: str) -> JSONObject:
        """POST /v1/allocations/{id}/confirm: pending -> active."""
        return self._post(f"/v1/allocations/{_segment(allocation_id)}/confirm")

    def extend(self, allocation_id: str, ttl_s: float) -> JSONObject:
        """POST /v1/allocations/{id}/extend: a new TTL for a pending reservation."""
        return self._post(f"/v1/allocations/{_segment(allocation_id)}/extend", {"ttl_s": ttl_s})

    def release(self, allocation_id: str) -> JSONObject:
        """POST /v1/allocations/{id}/release: ``{"released": [ids]}`` (empty if already ended)."""
        return self._post(f"/v1/allocations/{_segment(allocation_id)}/release")

    def release_job(self, job_id: str) -> JSONObject:
        """POST /v1/jobs/{job_id}/release: every live allocation of the job."""
        return self._post(f"/v1/jobs/{_segment(job_id)}/release")

    # -- cluster -----------------------------------------------------------

    def cluster(self) -> JSONObject:
        """GET /v1/cluster: node and GPU counts, fragmentation, allocations by state."""
        return self._get("/v1/cluster")

    # -- tokens (admin) ------------------------------------------------------

    def create_token(
        self,
        role: str,
        *,
        nodes: list[str] | None = None,
        region: str | None = None,
        name: str = "",
    ) -> JSONObject:
        """POST /v1/tokens: the new token, its secret in ``token`` (shown only this once)."""
        body: JSONObject = {"role": role, "nodes": list(nodes or []), "name": name}
        if region is not None:
            body["region"] = region
        return self._post("/v1/tokens", body)

    def tokens(self, include_revoked: bool = False) -> JSONObject:
        """GET /v1/tokens: ``{"tokens": [...]}``, without secrets."""
        return self._get("/v1/tokens", {"revoked": "true"} if include_revoked else None)

    def revoke_token(self, token_id: str) -> None:
        """DELETE /v1/tokens/{id} (204): refused everywhere within a second."""
        self._request("DELETE", f"/v1/tokens/{_segment(token_id)}")

    # -- federation (a global service) ----------------------------------------

    def register_region(self, body: Mapping[str, Any]) -> JSONObject:
        """POST /v1/regions: the region, its region token in ``token`` (shown only now)."""
        return self._post("/v1/regions", dict(body))

    def regions(self, include_retired: bool = False) -> JSONObject:
        """GET /v1/regions: ``{"regions": [...]}``."""
        return self._get("/v1/regions", {"retired": "true"} if include_retired else None)

    def region(self, name: str) -> JSONObject:
        return self._get(f"/v1/regions/{_segment(name)}")

    def update_region(self, name: str, changes: Mapping[str, Any]) -> JSONObject:
        """PATCH /v1/regions/{name}: set its ``url`` and/or ``forward_token`` again (a
        ``forward_token`` of None stops sending one); the region as it is now."""
        path = f"/v1/regions/{_segment(name)}"
        return self._object(self._request("PATCH", path, json=dict(changes)))

    def retire_region(self, name: str, *, force: bool = False) -> JSONObject:
        """POST /v1/regions/{name}/retire: refused (409 region_busy) with live allocations
        unless ``force``."""
        path = f"/v1/regions/{_segment(name)}/retire"
        params = {"force": "true"} if force else None
        return self._object(self._request("POST", path, params=params))

    def federation_place(
        self, request: Mapping[str, Any], idempotency_key: str | None = None
    ) -> JSONObject:
        """POST /v1/federation/place: the region, node, GPUs, cost and alternatives."""
        # ``is not None``, as ``place``: an empty key dropped here was no key at all.
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key is not None else None
        return self._post("/v1/federation/place", dict(request), headers=headers)

    def federation_score(self, request: Mapping[str, Any]) -> JSONObject:
        """POST /v1/federation/score: every region's candidate, best first."""
        return self._post("/v1/federation/score", dict(request))

    # -- the audit log (admin) -----------------------------------------------

    def audit(
        self,
        *,
        kind: str | None = None,
        action: str | None = None,
        actor: str | None = None,
        node: str | None = None,
        job_id: str | None = None,
        allocation_id: str | None = None,
        since: str | None = None,
        until: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> JSONObject:
        """GET /v1/audit: ``{"entries": [...], "next_cursor": ...}``, newest first; pass
        ``next_cursor`` back as ``cursor`` for the older rows."""
        given = {
            "kind": kind,
            "action": action,
            "actor": actor,
            "node": node,
            "job_id": job_id,
            "allocation_id": allocation_id,
            "since": since,
            "until": until,
            "limit": limit,
            "cursor": cursor,
        }
        params: dict[str, str | int] = {k: v for k, v in given.items() if v is not None}
        return self._get("/v1/audit", params)
