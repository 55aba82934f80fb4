"""A Kubernetes API server on loopback, as much of it as the extender uses.

Serves GET pod, LIST pods (fieldSelector on status.phase, limit/continue
paging) and POST pods/{name}/binding, which it records (body and headers),
then sets the pod's nodeName and copies the Binding's annotations onto the
pod, as a real API server does.
"""

from __future__ import annotations

import copy
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse


class FakeApiServer:
    def __init__(self, token: str) -> None:
        self.token = token
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            meta = pod["metadata"]
            self.pods[(meta["namespace"], meta["name"])] = copy.deepcopy(pod)
        return pod

    def delete(self, namespace: str, name: str) -> None:
        with self.lock:
            del self.pods[(namespace, name)]

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.pods[(namespace, name)])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _send(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(
                    code,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "status": "Failure",
                        "message": message,
                        "reason": reason,
                        "code": code,
                    },
                )

            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {api.token}":
                    return True
                self._status(401, "Unauthorized", "Unauthorized")
                return False

            def do_GET(self) -> None:
                if not self._authorized():
                    return
                url = urlparse(self.path)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                query = parse_qs(url.query)
                with api.lock:
                    if parts[:2] == ["api", "v1"] and len(parts) == 6 and parts[4] == "pods":
                        pod = api.pods.get((parts[3], parts[5]))
                        if pod is None:
                            self._status(404, "NotFound", f'pods "{parts[5]}" not found')
                        else:
                            self._send(200, {"kind": "Pod", "apiVersion": "v1", **pod})
                        return
                    if parts in (["api", "v1", "pods"],) or (
                        len(parts) == 5 and parts[4] == "pods"
                    ):
                        namespace = parts[3] if len(parts) == 5 else None
                        self._list(namespace, query)
                        return
                self._status(404, "NotFound", "the server could not find the requested resource")

            def _list(self, namespace: str | None, query: dict[str, list[str]]) -> None:
                excluded = {
                    term.split("!=", 1)[1]
                    for term in ",".join(query.get("fieldSelector", [])).split(",")
                    if term.startswith("status.phase!=")
                }
                pods = [
                    p
                    for (ns, _), p in sorted(api.pods.items())
                    if (namespace is None or ns == namespace)
                    and p.get("status", {}).get("phase") not in excluded
                ]
                start = int(query.get("continue", ["0"])[0])
                limit = int(query.get("limit", ["0"])[0]) or len(pods)
                page = pods[start : start + limit]
                more = str(start + limit) if start + limit < len(pods) else ""
                self._send(
                    200,
                    {
                        "kind": "PodList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": "200000", "continue": more},
                        "items": page,
                    },
                )

            def do_POST(self) -> None:
                if not self._authorized():
                    return
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                if not (len(parts) == 7 and parts[4] == "pods" and parts[6] == "binding"):
                    self._status(
                        404, "NotFound", "the server could not find the requested resource"
                    )
                    return
                with api.lock:
                    pod = api.pods.get((parts[3], parts[5]))
                    if pod is None:
                        self._status(404, "NotFound", f'pods "{parts[5]}" not found')
                        return
                    if pod["spec"].get("nodeName"):
                        self._status(409, "Conflict", f"pod {parts[5]} is already assigned to node")
                        return
                    api.bindings.append(
                        {
                            "path": self.path,
                            "body": body,
                            "content_type": self.headers.get("Content-Type"),
                        }
                    )
                    pod["spec"]["nodeName"] = body["target"]["name"]
                    pod["metadata"].setdefault("annotations", {}).update(
                        body["metadata"].get("annotations") or {}
                    )
                self._send(
                    201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
                )

        return Handler
