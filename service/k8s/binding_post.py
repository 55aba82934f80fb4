"""The Binding POST on a kept-alive connection per worker thread.

kube-scheduler waits on the bind verb for every GPU pod, and the Binding's
write to the API server is most of it. Through httpx's client the POST took
1.0 ms p50 against a loopback API server answering at once, where the same
request on a plain ``http.client`` connection takes 0.3 ms: httpx's pool,
its request and response models and its header handling cost more than the
exchange itself. The other calls (reading and listing pods, the watch) stay
on httpx, where their time is the API server's, not the client's.

A pod's bind runs on the event loop (``post_async``: asyncio streams, idle
connections kept per loop, one request at a time on each), and a gang
member's on a worker thread (``post``: one ``http.client`` connection per
thread, as they are not shared between threads). On the loop the bind needs
no hand-over to a worker thread and back, which cost 0.15 ms a bind on the
2-CPU AMD EPYC guest. A connection the API server closed while idle fails at
its next request before any answer arrives; the POST is then sent once more
on a new connection. Sending it twice is safe: a Binding already made answers
409, which the caller checks against the pod (service/k8s/bind.py).
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
import weakref
from typing import NamedTuple
from urllib.parse import urlsplit

# What a kept-alive connection the server has closed raises before any answer.
# A TLS connection closed without its close_notify (a load balancer cutting idle
# connections) says so with SSLEOFError.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ssl.SSLEOFError)


class Answer(NamedTuple):
    status: int
    reason: str
    body: bytes


class StaleConnection(ConnectionError):
    """A kept connection ended before its answer began: the server closed it while idle."""


_Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]
MAX_ANSWER_BYTES = 1 << 20  # a Binding's answer is a Status of a few hundred bytes


class BindingPoster:
    """POSTs JSON to one server, on one persistent connection per calling thread."""

    def __init__(self, server: str, verify: ssl.SSLContext | bool, timeout_s: float) -> None:
        parts = urlsplit(server)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._context: ssl.SSLContext | None = None
        if self._https:
            if isinstance(verify, ssl.SSLContext):
                self._context = verify
            elif verify:
                self._context = ssl.create_default_context()
            else:
                self._context = ssl._create_unverified_context()  # verify=False, as asked
        self._local = threading.local()
        # Idle connections of post_async, by event loop (a connection belongs to one).
        self._idle: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[_Stream]] = (
            weakref.WeakKeyDictionary()
        )

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._https:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=self._timeout_s, context=self._context
                )
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout_s)
            conn.connect()
            # A Binding is one small segment: it must not wait on the peer's delayed ACK.
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = conn
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        """The answer; raises OSError (and http.client's errors) when none came."""
        headers = {**headers, "Content-Type": "application/json"}
        reused = getattr(self._local, "conn", None) is not None
        try:
            return self._exchange(self._prefix + path, body, headers)
        except _STALE:
            if not reused:
                raise
            # The idle connection was closed by the server: once more, on a new one.
            return self._exchange(self._prefix + path, body, headers)

    def _exchange(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        try:
            conn = self._connection()
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            self._drop()  # a connection that failed mid-exchange is not used again
            raise
        if response.will_close:
            self._drop()
        return Answer(response.status, response.reason, data)

    def close(self) -> None:
        """Closes the calling thread's connection; the others close with their threads
        (and the event loop's with their loop)."""
        self._drop()

    async def post_async(self, path: str, body: bytes, headers: dict[str, str]) -> Answer:
        """``post`` on the running event loop: the answer; raises OSError (a connection
        refused or reset, TimeoutError) or ValueError (an answer that is not HTTP) when
        none came."""
        loop = asyncio.get_running_loop()
        head = self._request_head(path, len(body), headers)
        idle = self._idle.setdefault(loop, [])
        stream = idle.pop() if idle else None
        try:
            answer, keep = await self._exchange_async(stream, head + body)
        except StaleConnection:
            if stream is None:
                raise
            # The idle connection was closed by the server: once more, on a new one.
            answer, keep = await self._exchange_async(None, head + body)
        if keep is not None:
            idle.append(keep)
        return answer

    def _request_head(self, path: str, length: int, headers: dict[str, str]) -> bytes:
        lines = [f"POST {self._prefix}{path} HTTP/1.1", f"Host: {self._host}:{self._port}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines += ["Content-Type: application/json", f"Content-Length: {length}", "", ""]
        return "\r\n".join(lines).encode("latin-1")

    async def _exchange_async(
        self, stream: _Stream | None, request: bytes
    ) -> tuple[Answer, _Stream | None]:
        """(the answer, the connection to keep, or None when it must close)."""
        reused = stream is not None
        try:
            async with asyncio.timeout(self._timeout_s):
                if stream is None:
                    stream = await asyncio.open_connection(
                        self._host,
                        self._port,
                        ssl=self._context,
                        server_hostname=self._host if self._context is not None else None,
                    )
                reader, writer = stream
                writer.write(request)
                try:
                    status_line = await reader.readline()
                except (BrokenPipeError, ConnectionResetError) as exc:
                    if reused:  # reset while it sat idle: as a close, before any answer
                        raise StaleConnection("the kept connection was reset") from exc
                    raise
                if not status_line:
                    if reused:
                        raise StaleConnection("the kept connection was closed")
                    raise ConnectionResetError("the server closed the connection unanswered")
                answer, keep_alive = await _read_answer(status_line, reader)
        except BaseException:
            if stream is not None:
                stream[1].close()  # a connection that failed mid-exchange is not used again
            raise
        if keep_alive:
            return answer, stream
        stream[1].close()
        return answer, None


async def _read_answer(status_line: bytes, reader: asyncio.StreamReader) -> tuple[Answer, bool]:
    """The answer after its status line, and whether the connection may carry another."""
    version, _, rest = status_line.decode("latin-1").rstrip("\r\n").partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError(f"not an HTTP answer: {status_line[:80]!r}")
    fields: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        fields[name.strip().lower()] = value.strip()
    chunked = "chunked" in fields.get("transfer-encoding", "").lower()
    length = fields.get("content-length")
    if chunked:
        body = await _read_chunked(reader)
    elif length is not None and length.isdigit() and int(length) <= MAX_ANSWER_BYTES:
        body = await reader.readexactly(int(length))
    elif length is None:
        body = await _read_to_end(reader)
    else:
        raise ValueError(f"an answer of {length} bytes is not a Binding's answer")
    keep_alive = (
        version == "HTTP/1.1"
        and "close" not in fields.get("connection", "").lower()
        and (chunked or length is not None)
    )
    return Answer(int(code), reason, body), keep_alive


async def _read_to_end(reader: asyncio.StreamReader) -> bytes:
    """An answer that declares no length: it ends with the connection, in as many
    segments as it takes (``read`` returns with the first)."""
    body = b""
    while chunk := await reader.read(1 << 16):
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise ValueError(f"an answer of over {MAX_ANSWER_BYTES} bytes is not a Binding's")
    return body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        line = (await reader.readline()).split(b";", 1)[0].strip()
        chunk = int(line, 16)  # ValueError for what is not a chunk size
        if chunk == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        size += chunk
        if size > MAX_ANSWER_BYTES:
            raise ValueError("a chunked answer larger than a Binding's answer")
        parts.append(await reader.readexactly(chunk))
        await reader.readexactly(2)  # the chunk's CRLF
