"""Forwarding to a region over real loopback sockets, with the client the service uses."""

from __future__ import annotations

import asyncio

import orjson

from service.federation.forward import Asked, Outcome, forward, region_client

ONE_GPU = Asked(tasks=1, gpus=1)

PLACED = orjson.dumps({"id": "a", "tasks": [{"node": "n1", "gpu_uuids": ["GPU-0"]}]})


async def _answer_placed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    await reader.readexactly(length)
    writer.write(
        b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(PLACED)}\r\n\r\n".encode()
        + PLACED
    )
    await writer.drain()
    writer.close()


def test_a_region_that_holds_many_requests_leaves_the_other_regions_theirs() -> None:
    """A region that takes requests and never answers held one connection each of the
    client's 100: with as many of them in flight, every forward to any other region
    waited for a free connection until its time ran out, and was then told apart from
    an answer lost (the region may have reserved) though nothing had been sent."""
    accepted: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)
        await asyncio.sleep(30)

    async def main() -> None:
        slow = await asyncio.start_server(hold, "127.0.0.1", 0)
        fast = await asyncio.start_server(_answer_placed, "127.0.0.1", 0)
        slow_url = f"http://127.0.0.1:{slow.sockets[0].getsockname()[1]}"
        fast_url = f"http://127.0.0.1:{fast.sockets[0].getsockname()[1]}"
        async with region_client() as client:
            stuck = [
                asyncio.create_task(
                    forward(client, slow_url, None, {"gpus": 1}, None, 20.0, ONE_GPU)
                )
                for _ in range(110)
            ]
            for _ in range(200):
                if len(accepted) >= 100:
                    break
                await asyncio.sleep(0.05)
            assert len(accepted) >= 100, f"only {len(accepted)} requests reached the region"
            result = await forward(client, fast_url, None, {"gpus": 1}, "k", 2.0, ONE_GPU)
            assert result.outcome is Outcome.PLACED, result
            for task in stuck:
                task.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)
        for writer in accepted:
            writer.close()
        slow.close()
        fast.close()

    asyncio.run(main())
