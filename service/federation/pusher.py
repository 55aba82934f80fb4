"""A region's service pushing its signed summary to the global service.

Every ``federation_check_s`` the engine's change counters are read; when
they moved, the summary is built from the in-memory cluster (and the count
of live allocations) and pushed if it differs from the last one pushed. It
is pushed at least every ``federation_push_s`` seconds even when nothing
changed, so that the global service can tell a quiet region from a dead
one; the summary walks every node under the state lock, so a quiet region
does not build it more often than that. A push that fails is tried again at the next check.
The seq is the wall clock in nanoseconds, and always above the last one
sent, so a restarted region's summaries stay newer than its old ones; a
summary refused as a replay names the stored seq, and the next goes past it
(a region whose clock went back).
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import sqlalchemy as sa

from agent.signing import NodeKey
from service.event_loop import off_loop
from service.federation.schemas import RegionSummary
from service.federation.signing import sign_summary
from service.federation.summary import change_key, content_of, summarize
from service.schema import allocations
from service.settings import Settings
from service.state import ServiceState

log = logging.getLogger("topoplace.federation")
# What is read of the global service's answer: its refusals are a few hundred bytes.
ANSWER_BYTES = 64 << 10


def live_allocations(engine: sa.Engine) -> int:
    query = (
        sa.select(sa.func.count()).select_from(allocations).where(allocations.c.live.isnot(None))
    )
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


class SummaryPusher:
    def __init__(self, state: ServiceState, settings: Settings) -> None:
        assert settings.federation_global and settings.region_name and settings.region_key
        self.state = state
        self.url = settings.federation_global.rstrip("/")
        self.region = settings.region_name
        self.token = settings.region_token_value()
        if not self.token:
            raise ValueError("the region token is empty (TOPOPLACE_REGION_TOKEN[_FILE])")
        self.key = NodeKey.load(Path(settings.region_key))
        self.push_s = settings.federation_push_s
        self.check_s = settings.federation_check_s
        self._last_content: dict[str, Any] | None = None
        self._last_key: tuple[int, int] | None = None
        self._last_push = -1e18
        self._seq = 0
        self._last_cut: dict[str, int] | None = None
        self.pushed = 0  # summaries the global service took

    def _build(self, due: bool) -> tuple[tuple[int, int], dict[str, Any]] | None:
        """The summary to push, or None when nothing changed and no push is due: the
        summary walks every node under the state lock, so a quiet region skips it."""
        key = change_key(self.state)
        if key == self._last_key and not due:
            return None
        live = live_allocations(self.state.engine)
        seq = max(time.time_ns(), self._seq + 1)
        built = summarize(self.state, self.region, seq, self.state.clock(), live)
        # Signed as the global service reads it back: through the same model.
        return key, RegionSummary.model_validate(built).model_dump(mode="json")

    async def tick(self, client: httpx.AsyncClient) -> None:
        due = time.monotonic() - self._last_push >= self.push_s
        built = await off_loop(self._build, due)
        if built is None:
            return
        key, summary = built
        self._tell_cut(summary.get("cut"))
        content = content_of(summary)
        if content == self._last_content and not due:
            self._last_key = key
            return
        body = {"summary": summary, "signature": sign_summary(self.key, summary)}
        status, answer = await self._send(client, body)
        if status != 200:
            log.warning(
                "the global service refused region %s's summary: %s %s",
                self.region,
                status,
                answer[:300].decode("utf-8", "replace"),
            )
            self._learn_stored_seq(answer)
            return
        self._seq = summary["seq"]
        self._last_key = key
        self._last_content = content
        self._last_push = time.monotonic()
        self.pushed += 1

    async def _send(self, client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[int, bytes]:
        """PUT the summary: the answer's status and at most ANSWER_BYTES of its body, the
        whole exchange within the push's time. httpx's timeouts are per read: an answer
        trickled a byte at a time held this push, and every one after it, for as long as
        it trickled, and a body of any size was read whole."""
        limit = max(1.0, self.check_s * 4)
        async with asyncio.timeout(limit):
            async with client.stream(
                "PUT",
                f"{self.url}/v1/regions/{self.region}/summary",
                json=body,
                headers={"Authorization": f"Bearer {self.token}", "Accept-Encoding": "identity"},
                timeout=limit,
            ) as response:
                read = bytearray()
                async for chunk in response.aiter_bytes():
                    read += chunk
                    if len(read) >= ANSWER_BYTES:
                        break
                return response.status_code, bytes(read[:ANSWER_BYTES])

    def _tell_cut(self, cut: dict[str, int] | None) -> None:
        """Warn when the summary is cut to fit the global service's limits, once each
        time what was cut changes (the summary is built up to twice a second)."""
        if cut is not None and cut != self._last_cut:
            log.warning(
                "region %s's summary is cut to fit the global service's limits: %d designs"
                " (%d free GPUs) and %d cliques left out, %d names shortened"
                " (docs/federation.md)",
                self.region,
                cut["designs"],
                cut["free_gpus"],
                cut["cliques"],
                cut["names"],
            )
        self._last_cut = cut

    def _learn_stored_seq(self, answer: bytes) -> None:
        """A summary refused as a replay: the global service holds a later seq, sent when
        this region's clock was ahead (before a restart, or a correction). The next seq
        goes past it, rather than waiting, stale, until the clock catches up; only this
        region's key signs a summary, so skipping seqs gives nobody anything."""
        try:
            error = orjson.loads(answer)["error"]
            stored = error["detail"]["stored_seq"] if error["code"] == "replayed_summary" else None
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return
        if isinstance(stored, int) and not isinstance(stored, bool) and stored > self._seq:
            self._seq = stored

    async def run(self) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            while True:
                try:
                    await self.tick(client)
                except Exception as exc:  # the global service down: try again next check
                    log.warning("pushing region %s's summary failed: %r", self.region, exc)
                await asyncio.sleep(self.check_s)
