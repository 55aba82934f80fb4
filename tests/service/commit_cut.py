"""A TCP proxy in front of Postgres that loses the answer to a COMMIT: an ambiguous commit.

Armed, it lets everything through until the server confirms a COMMIT (its
CommandComplete message, tag ``COMMIT``); that answer is dropped and the
connection cut, as a network that fails between the server's commit and the
client's hearing of it. The transaction is durable; the client sees its
connection lost. One COMMIT per arming.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

# Postgres's CommandComplete for a COMMIT: 'C', a length of 11, "COMMIT" and its NUL.
COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"


class CommitCut:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.armed = 0  # COMMIT answers still to drop
        self.dropped = 0  # COMMIT answers dropped so far
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def __enter__(self) -> CommitCut:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.listener.close()

    def arm(self, commits: int = 1) -> None:
        """Drop the answer of the next ``commits`` COMMITs, on whichever connection."""
        with self._lock:
            self.armed = commits

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, answers: bool) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if answers and COMMITTED in data and self._take():
                    break  # the server committed; its client never hears so
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _take(self) -> bool:
        with self._lock:
            if self.armed == 0:
                return False
            self.armed -= 1
            self.dropped += 1
            return True
