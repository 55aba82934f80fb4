"""A lean HTTP/1.1 load generator for the service benchmarks.

The service and its load share the benchmark machine's two cores, so the
load must cost far less CPU than what it measures: a thread-per-client
httpx load spent about a millisecond of CPU per request, as much as the
service. This one keeps N keep-alive connections on one asyncio loop and
writes pre-encoded requests (tens of microseconds per request).

Open loop (fixed offered load): request i is due at i / rate and its latency
counts from then, so queueing in the service shows; a request finding every
connection busy waits for one, and that wait is counted too.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class LoadResult:
    latencies: list[float]
    statuses: list[int]
    seconds: float

    @property
    def rate(self) -> float:
        return len(self.statuses) / self.seconds

    def non(self, status: int) -> int:
        return sum(1 for s in self.statuses if s != status)


def encode_post(base: str, path: str, body: bytes) -> bytes:
    host = urlsplit(base).netloc
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def exchange(self, request: bytes) -> int:
        self.writer.write(request)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the service closed the connection")
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


async def _open(base: str, count: int) -> list[_Connection]:
    parts = urlsplit(base)
    out = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        out.append(_Connection(reader, writer))
    return out


async def _fixed(base: str, requests: Sequence[bytes], rate: float, conns: int) -> LoadResult:
    pool: asyncio.Queue[_Connection] = asyncio.Queue()
    connections = await _open(base, conns)
    for c in connections:
        pool.put_nowait(c)
    latencies: list[float] = []
    statuses: list[int] = []
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.1

    async def one(index: int, due: float) -> None:
        conn = await pool.get()
        try:
            status = await conn.exchange(requests[index])
        finally:
            pool.put_nowait(conn)
        latencies.append(loop.time() - due)
        statuses.append(status)

    tasks = []
    for i in range(len(requests)):
        due = start + i / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i, due)))
    await asyncio.gather(*tasks)
    seconds = loop.time() - start
    for c in connections:
        c.close()
    return LoadResult(latencies, statuses, seconds)


async def _closed(
    base: str, make: Callable[[int], bytes], seconds: float, conns: int
) -> LoadResult:
    connections = await _open(base, conns)
    latencies: list[float] = []
    statuses: list[int] = []
    loop = asyncio.get_running_loop()
    begin = loop.time()
    stop = begin + seconds
    counter = 0

    async def client(conn: _Connection) -> None:
        nonlocal counter
        while loop.time() < stop:
            counter += 1
            t0 = loop.time()
            statuses.append(await conn.exchange(make(counter)))
            latencies.append(loop.time() - t0)

    await asyncio.gather(*(client(c) for c in connections))
    elapsed = loop.time() - begin
    for c in connections:
        c.close()
    return LoadResult(latencies, statuses, elapsed)


def _quiet_collector() -> None:
    """Freeze what the calling process holds (a benchmark's 10,000-node model, say):
    a full collection walking it stalled this generator for half a second, which
    showed up as the service's p99."""
    gc.collect()
    gc.freeze()


def fixed_rate(base: str, requests: Sequence[bytes], rate: float, conns: int = 64) -> LoadResult:
    """Send pre-encoded ``requests`` at ``rate`` per second (open loop)."""
    _quiet_collector()
    return asyncio.run(_fixed(base, requests, rate, conns))


def saturate(
    base: str, make: Callable[[int], bytes], seconds: float, conns: int = 32
) -> LoadResult:
    """``conns`` clients send back to back for ``seconds`` (closed loop)."""
    _quiet_collector()
    return asyncio.run(_closed(base, make, seconds, conns))


async def _sequence(base: str, requests: Sequence[bytes]) -> list[tuple[float, int]]:
    (conn,) = await _open(base, 1)
    out = []
    for request in requests:
        t0 = time.perf_counter()
        status = await conn.exchange(request)
        out.append((time.perf_counter() - t0, status))
    conn.close()
    return out


def in_sequence(base: str, requests: Sequence[bytes]) -> list[tuple[float, int]]:
    """(latency, status) of each request, sent one after another on one connection."""
    _quiet_collector()
    return asyncio.run(_sequence(base, requests))
