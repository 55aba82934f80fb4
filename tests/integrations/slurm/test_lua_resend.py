"""topoplace_client.lua sends a request again only on a connection that closed with no
answer, and then under the same Idempotency-Key: a service that read the request,
committed the reservation and stopped before answering replays it to the resend."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integrations.slurm.loopback import LUA_DIR
from tests.integrations.slurm.test_lua_tls import LUA
from tests.integrations.slurm.test_lua_tls import _prerequisites as _prerequisites  # Lua only

# Two submissions, each under a key of its own, on the module's one kept connection.
SCRIPT = """
package.path = arg[1] .. "/?.lua;" .. package.path
local client = require("topoplace_client")
for _ = 1, 2 do
  local status = client.post("/v1/slurm/job-submit", { batch = true }, client.new_key())
  print(status)
end
"""
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += conn.recv(65536)
    return head


class DiesAfterReading:
    """Answers the first request of its first connection, reads the second and closes
    without a word (a service stopped after its commit), then answers on a new one."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.heads: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        first, _ = self.server.accept()
        self.heads.append(_read_request(first))
        first.sendall(ANSWER)
        self.heads.append(_read_request(first))
        first.close()
        second, _ = self.server.accept()
        self.heads.append(_read_request(second))
        second.sendall(ANSWER)
        second.close()


@pytest.fixture
def server() -> Iterator[DiesAfterReading]:
    serving = DiesAfterReading()
    serving.thread.start()
    yield serving
    serving.server.close()


def _key(head: bytes) -> str:
    for line in head.decode().split("\r\n"):
        name, _, value = line.partition(":")
        if name.lower() == "idempotency-key":
            return value.strip()
    raise AssertionError(f"no Idempotency-Key in {head!r}")


@pytest.mark.usefixtures("_prerequisites")
def test_a_request_sent_again_carries_its_first_sendings_key(
    tmp_path: Path, server: DiesAfterReading
) -> None:
    shutil.copy(LUA_DIR / "topoplace_client.lua", tmp_path)
    (tmp_path / "topoplace.conf").write_text(
        f"server = http://127.0.0.1:{server.port}\ntimeout_ms = 5000\n"
    )
    assert LUA is not None
    done = subprocess.run(
        [LUA, "-", str(tmp_path)], input=SCRIPT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["200", "200"]
    server.thread.join(timeout=10)
    first, lost, resent = (_key(head) for head in server.heads)
    assert lost == resent  # the same submission: replayed, not reserved twice
    assert first != lost  # another submission: a key of its own
    assert first.startswith("slurm-") and len(first) <= 256
