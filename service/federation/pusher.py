"""A region's service pushing its signed summary to the global service.

Every ``federation_check_s`` the summary is built from the in-memory
cluster (and the count of live allocations); it is pushed when it differs
from the last one pushed, and at least every ``federation_push_s`` seconds
even when nothing changed, so that the global service can tell a quiet
region from a dead one. A push that fails is tried again at the next check.
The seq is the wall clock in nanoseconds, and always above the last one
sent, so a restarted region's summaries stay newer than its old ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from agent.signing import NodeKey
from service.event_loop import off_loop
from service.federation.schemas import RegionSummary
from service.federation.signing import sign_summary
from service.federation.summary import content_of, summarize
from service.schema import allocations
from service.settings import Settings
from service.state import ServiceState

log = logging.getLogger("topoplace.federation")


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
        self._last_push = -1e18
        self._seq = 0
        self.pushed = 0  # summaries the global service took

    def _build(self) -> dict[str, Any]:
        live = live_allocations(self.state.engine)
        seq = max(time.time_ns(), self._seq + 1)
        built = summarize(self.state, self.region, seq, self.state.clock(), live)
        # Signed as the global service reads it back: through the same model.
        return RegionSummary.model_validate(built).model_dump(mode="json")

    async def tick(self, client: httpx.AsyncClient) -> None:
        summary = await off_loop(self._build)
        content = content_of(summary)
        due = time.monotonic() - self._last_push >= self.push_s
        if content == self._last_content and not due:
            return
        body = {"summary": summary, "signature": sign_summary(self.key, summary)}
        response = await client.put(
            f"{self.url}/v1/regions/{self.region}/summary",
            json=body,
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=max(1.0, self.check_s * 4),
        )
        if response.status_code != 200:
            log.warning(
                "the global service refused region %s's summary: %s %s",
                self.region,
                response.status_code,
                response.text[:300],
            )
            return
        self._seq = summary["seq"]
        self._last_content = content
        self._last_push = time.monotonic()
        self.pushed += 1

    async def run(self) -> None:
        async with httpx.AsyncClient(trust_env=False) as client:
            while True:
                try:
                    await self.tick(client)
                except Exception as exc:  # the global service down: try again next check
                    log.warning("pushing region %s's summary failed: %r", self.region, exc)
                await asyncio.sleep(self.check_s)
