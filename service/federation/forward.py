"""Forwarding a placement to a region's own service, and what came of it.

The region's ``POST /v1/place`` gets the request as the caller sent it (less
the federation block, with the GPU model the ranking chose) and the same
Idempotency-Key, so a retry there answers the allocation made before.

An answer other than 200/201 is a refusal; its error code says whether the
region looked the Idempotency-Key up and holds nothing for it (``LOOKED_UP``:
it found nothing free for the request). A connection that could not be made
is unreachable: nothing was sent. A request sent whose answer never came (a
read timeout) is ambiguous: the region may have reserved. What each means
for the job and its key is routing's to decide (service/federation/routing.py).
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


# The region's refusals that come after it looked the key up and found no allocation
# for it (service/allocations/place_flow.py): a key refused so holds nothing there.
LOOKED_UP = frozenset({"unschedulable", "unresolvable"})


@dataclass(frozen=True)
class Forwarded:
    outcome: Outcome
    status: int | None
    detail: str
    body: dict[str, Any] | None = None
    replayed: bool = False
    code: str | None = None  # the region's error code, when it refused in its error shape


def _error(response: httpx.Response) -> tuple[str | None, str]:
    """The refusal's code (None when not in the service's error shape) and its detail."""
    try:
        error = orjson.loads(response.content).get("error", {})
        code, message = error.get("code"), error.get("message")
    except (orjson.JSONDecodeError, AttributeError):
        return None, response.text[:200]
    return (code if isinstance(code, str) else None), f"{code}: {message}"


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
    code, detail = _error(response)
    return Forwarded(Outcome.REFUSED, response.status_code, detail, code=code)
