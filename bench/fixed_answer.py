"""An HTTP server that answers every request at once with the same body.

The filter's Lua client pointed at it measures what a filter call costs with
no service behind it: the round trip, and slurmctld's and the script's own
work. A separate process, as the service is, running plain asyncio.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tests.integrations.slurm.loopback import free_port

SERVER = """
import asyncio, sys
BODY = sys.argv[2].encode()
HEAD = b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n"
ANSWER = HEAD + b"content-length: %d\\r\\n\\r\\n%s" % (len(BODY), BODY)
class Fixed(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.buffer = transport, b""
    def data_received(self, data):
        self.buffer += data
        while (end := self.buffer.find(b"\\r\\n\\r\\n")) >= 0:
            length = 0
            for line in self.buffer[:end].split(b"\\r\\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length:]
            self.transport.write(ANSWER)
async def main():
    server = await asyncio.get_running_loop().create_server(Fixed, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
asyncio.run(main())
"""


@contextmanager
def fixed_answer(body: str) -> Iterator[str]:
    """The URL of a server answering ``body`` to every request, while the block runs."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", SERVER, str(port), body])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                httpx.post(url, content=b"{}", timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the fixed-answer server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait()
