"""A Kubernetes API server on loopback, as much of it as the extender uses.

Serves GET pod, LIST pods (fieldSelector on status.phase, limit/continue
paging, the list's resourceVersion), WATCH pods (a chunked stream of
newline-separated JSON events from a resourceVersion, BOOKMARK events, an
ERROR event with a 410 Status once the history it asks for is compacted),
POST pods/{name}/binding, which it records (body and headers), then sets the
pod's nodeName and copies the Binding's annotations onto the pod, as a real
API server does, and merge PATCH of a Node's labels. Every change bumps the
resourceVersion and is kept in a history that watches replay.

Tests steer it: ``set_phase`` and ``delete`` change pods (events follow),
``bookmark`` sends a BOOKMARK on every open watch, ``break_watches`` cuts
every open stream mid-way, ``stall_watches`` holds every watch's events back
(the stream stays open and says nothing, as a lagging watch cache does) until
``resume_watches``, ``compact`` forgets the history (the next watch
from an older version gets 410 Gone), ``refuse`` answers 503 to everything,
and clearing ``bind_gate`` holds bindings open until it is set again.
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
        self.nodes: dict[str, dict[str, Any]] = {}
        self.bindings: list[dict[str, Any]] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.requests: list[tuple[str, str]] = []  # (method, path with query)
        self.lock = threading.Condition()
        self.version = 100
        self.history: list[tuple[int, str, Any]] = []  # (rv, type, object)
        self.oldest = 100  # a watch from an older version is answered 410 Gone
        self.bookmarks = 0
        self.cuts = 0
        self.stalled = False
        self.refuse = False
        self.stopping = False
        self.bind_gate = threading.Event()
        self.bind_gate.set()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeApiServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self.bind_gate.set()
        self._server.shutdown()
        self._server.server_close()

    # -- changes, each one an event -------------------------------------------------

    def _changed(self, type_: str, obj: dict[str, Any]) -> None:
        """Called with the lock held."""
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        self.history.append((self.version, type_, copy.deepcopy(obj)))
        self.lock.notify_all()

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            meta = pod["metadata"]
            stored = copy.deepcopy(pod)
            self.pods[(meta["namespace"], meta["name"])] = stored
            self._changed("ADDED", stored)
        return pod

    def send_raw(self, type_: str, obj: Any) -> None:
        """An event whose object is sent as given, whatever its shape (a proxy's garbage,
        another API version's object); with no type, ``obj`` is the whole line."""
        with self.lock:
            self.version += 1
            self.history.append((self.version, type_, obj))
            self.lock.notify_all()

    def add_node(self, name: str) -> None:
        with self.lock:
            self.nodes[name] = {"metadata": {"name": name, "labels": {}}}

    def delete(self, namespace: str, name: str) -> None:
        with self.lock:
            pod = self.pods.pop((namespace, name))
            self._changed("DELETED", pod)

    def set_phase(self, namespace: str, name: str, phase: str) -> None:
        with self.lock:
            pod = self.pods[(namespace, name)]
            pod.setdefault("status", {})["phase"] = phase
            self._changed("MODIFIED", pod)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.pods[(namespace, name)])

    def bump(self, changes: int) -> None:
        """Other kinds of objects changed: the version (one counter for all) moves."""
        with self.lock:
            self.version += changes

    def bookmark(self) -> None:
        with self.lock:
            self.bookmarks += 1
            self.lock.notify_all()

    def break_watches(self) -> None:
        with self.lock:
            self.cuts += 1
            self.lock.notify_all()

    def stall_watches(self) -> None:
        with self.lock:
            self.stalled = True

    def resume_watches(self) -> None:
        with self.lock:
            self.stalled = False
            self.lock.notify_all()

    def compact(self) -> None:
        with self.lock:
            self.history.clear()
            self.oldest = self.version + 1
            self.lock.notify_all()

    def count(self, method: str, prefix: str) -> int:
        with self.lock:
            return sum(1 for m, p in self.requests if m == method and p.startswith(prefix))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked watch streams, keep-alive elsewhere

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
                self._send(code, _status(code, reason, message))

            def _admitted(self) -> bool:
                with api.lock:
                    api.requests.append((self.command, self.path))
                    refuse = api.refuse
                if refuse:
                    self._status(503, "ServiceUnavailable", "the server is shutting down")
                    return False
                if self.headers.get("Authorization") == f"Bearer {api.token}":
                    return True
                self._status(401, "Unauthorized", "Unauthorized")
                return False

            def do_GET(self) -> None:
                if not self._admitted():
                    return
                url = urlparse(self.path)
                parts = [unquote(p) for p in url.path.strip("/").split("/")]
                query = parse_qs(url.query)
                if parts == ["api", "v1", "pods"] and query.get("watch", [""])[0] in ("1", "true"):
                    self._watch(query)
                    return
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
                        "metadata": {"resourceVersion": str(api.version), "continue": more},
                        "items": page,
                    },
                )

            def _chunk(self, event: Any) -> None:
                data = json.dumps(event).encode() + b"\n"
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _watch(self, query: dict[str, list[str]]) -> None:
                since = int(query.get("resourceVersion", ["0"])[0] or 0)
                bookmarks = query.get("allowWatchBookmarks", [""])[0] == "true"
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                with api.lock:
                    if since < api.oldest - 1:
                        gone = f"too old resource version: {since} ({api.oldest})"
                        self._chunk({"type": "ERROR", "object": _status(410, "Expired", gone)})
                        self._end()
                        return
                    sent, marks, cuts = since, api.bookmarks, api.cuts
                    while not api.stopping:
                        for rv, type_, obj in [] if api.stalled else api.history:
                            if rv > sent:
                                self._chunk({"type": type_, "object": obj} if type_ else obj)
                                sent = rv
                        if bookmarks and api.bookmarks != marks:
                            marks = api.bookmarks
                            mark: dict[str, Any] = {"kind": "Pod", "apiVersion": "v1"}
                            mark["metadata"] = {"resourceVersion": str(api.version)}
                            self._chunk({"type": "BOOKMARK", "object": mark})
                            sent = api.version
                        if api.cuts != cuts:
                            self.close_connection = True  # mid-stream: no closing chunk
                            return
                        api.lock.wait(1.0)
                self._end()

            def _end(self) -> None:
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length", "0"))
                body: dict[str, Any] = json.loads(self.rfile.read(length))
                return body

            def do_PATCH(self) -> None:
                if not self._admitted():
                    return
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                body = self._body()
                if not (len(parts) == 4 and parts[:3] == ["api", "v1", "nodes"]):
                    self._status(
                        404, "NotFound", "the server could not find the requested resource"
                    )
                    return
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    self._status(415, "UnsupportedMediaType", "unsupported patch type")
                    return
                with api.lock:
                    node = api.nodes.get(parts[3])
                    if node is None:
                        self._status(404, "NotFound", f'nodes "{parts[3]}" not found')
                        return
                    api.patches.append((parts[3], body))
                    node["metadata"]["labels"].update((body.get("metadata") or {}).get("labels"))
                    self._send(200, {"kind": "Node", "apiVersion": "v1", **node})

            def do_POST(self) -> None:
                if not self._admitted():
                    return
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                body = self._body()
                if not (len(parts) == 7 and parts[4] == "pods" and parts[6] == "binding"):
                    self._status(
                        404, "NotFound", "the server could not find the requested resource"
                    )
                    return
                api.bind_gate.wait()
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
                    api._changed("MODIFIED", pod)
                self._send(
                    201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}
                )

        return Handler


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
