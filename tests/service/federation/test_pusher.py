"""A region's pusher against a global service whose answers the test chooses."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import sqlalchemy as sa

from agent.signing import NodeKey
from placement.profiles import build_profile
from service import schema
from service.federation.pusher import SummaryPusher
from service.settings import Settings
from service.state import ServiceState


def pusher(tmp_path: Path, database_url: str) -> SummaryPusher:
    key_file = tmp_path / "region.pem"
    NodeKey.generate().save(key_file)
    settings = Settings(
        database_url=database_url,
        federation_global="http://global.example",
        region_name="aws-east",
        region_token="region-token",
        region_key=str(key_file),
    )
    engine = sa.create_engine(settings.database_url)
    schema.metadata.create_all(engine)  # a SQLite file's; Postgres' is migrated
    state = ServiceState(settings, engine)
    state.cluster.upsert(build_profile("hgx-h100", "h1"))
    state.heartbeats["h1"] = state.clock()
    state.refresh_availability()
    return SummaryPusher(state, settings)


def test_a_region_whose_clock_went_back_pushes_past_its_stored_seq(
    tmp_path: Path, database_url: str
) -> None:
    """The seq is the region's clock. A region restarted with its clock an hour behind the
    one it pushed with (a clock that ran fast, corrected) had every summary refused as a
    replay for that hour: stale, never routed to, though alive. The global service's
    refusal names the stored seq; the next summary goes past it."""
    stored = time.time_ns() + 3600 * 10**9
    seqs: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seq = orjson.loads(request.content)["summary"]["seq"]
        seqs.append(seq)
        if seq <= stored:
            error: dict[str, Any] = {
                "code": "replayed_summary",
                "message": "seq is not newer",
                "detail": {"stored_seq": stored},
            }
            return httpx.Response(409, json={"error": error})
        return httpx.Response(200, json={"region": "aws-east", "seq": seq})

    region = pusher(tmp_path, database_url)

    async def ticks() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            for _ in range(2):
                await region.tick(client)

    asyncio.run(ticks())
    assert len(seqs) == 2 and seqs[0] <= stored
    region.state.engine.dispose()
    assert seqs[1] > stored and region.pushed == 1


def test_a_push_answered_a_byte_at_a_time_is_cut_at_its_time(
    tmp_path: Path, database_url: str
) -> None:
    """httpx's timeouts are per read: a global service (or a proxy before it) trickling
    its answer held the push, and every push after it, for as long as it trickled; the
    region went stale though alive. A push has a time of its own, and the next is sent."""
    calls: list[int] = []

    async def trickle() -> Any:
        while True:
            await asyncio.sleep(0.05)
            yield b" "

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(200, content=trickle())
        seq = orjson.loads(request.content)["summary"]["seq"]
        return httpx.Response(200, json={"region": "aws-east", "seq": seq})

    region = pusher(tmp_path, database_url)
    region.check_s = 0.1  # a push's time: max(1 s, 4 checks)

    async def ticks() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            for _ in range(2):
                # As run() does: the failed push is logged, and the next check pushes.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(region.tick(client), 5.0)

    started = time.monotonic()
    asyncio.run(ticks())
    region.state.engine.dispose()
    assert time.monotonic() - started < 5.0, "the trickled push was not cut"
    assert len(calls) == 2 and region.pushed == 1
