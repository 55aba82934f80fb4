"""Forwarding a placement to a region's own service, and what came of it.

The region's ``POST /v1/place`` gets the request as the caller sent it (less
the federation block, with the GPU model the ranking chose) and the same
Idempotency-Key, so a retry there answers the allocation made before.

An answer other than 200/201 is a refusal (the summary was stale, the
request does not suit that region): nothing was reserved and the next
region may be tried. A connection that could not be made is unreachable,
and nothing was reserved either. A request sent whose answer never came
(a read timeout) is ambiguous: the region may have reserved. Without a key
the next region is tried; with one the job stops there (503
``region_unavailable``) and the same key, retried, goes to the same region.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import httpx
import orjson


class Outcome(enum.StrEnum):
    PLACED = "placed"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    AMBIGUOUS = "unanswered"


@dataclass(frozen=True)
class Forwarded:
    outcome: Outcome
    status: int | None
    detail: str
    body: dict[str, Any] | None = None
    replayed: bool = False


def _detail(response: httpx.Response) -> str:
    try:
        error = orjson.loads(response.content).get("error", {})
        return f"{error.get('code')}: {error.get('message')}"
    except (orjson.JSONDecodeError, AttributeError):
        return response.text[:200]


async def forward(
    client: httpx.AsyncClient,
    url: str,
    token: str | None,
    body: dict[str, Any],
    key: str | None,
    timeout_s: float,
) -> Forwarded:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if key is not None:
        headers["Idempotency-Key"] = key
    try:
        response = await client.post(
            f"{url}/v1/place", content=orjson.dumps(body), headers=headers, timeout=timeout_s
        )
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        return Forwarded(Outcome.UNREACHABLE, None, f"not reachable: {exc!r}")
    except httpx.TransportError as exc:
        return Forwarded(Outcome.AMBIGUOUS, None, f"sent, no answer: {exc!r}")
    if response.status_code in (200, 201):
        replayed = response.headers.get("Idempotent-Replayed") == "true"
        answer = orjson.loads(response.content)
        return Forwarded(Outcome.PLACED, response.status_code, "placed", answer, replayed)
    return Forwarded(Outcome.REFUSED, response.status_code, _detail(response))
