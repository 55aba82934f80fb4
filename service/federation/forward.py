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

import asyncio
import enum
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from service.federation import bearer


class Outcome(enum.StrEnum):
    PLACED = "placed"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    AMBIGUOUS = "unanswered"


# The region's refusals that come after it looked the key up and found no allocation
# for it (service/allocations/place_flow.py), with the status it gives each: a key
# refused so holds nothing there. The code under another status (a proxy's 502 around
# it) is no such look-up.
LOOKED_UP = {"unschedulable": 409, "unresolvable": 422}


@dataclass(frozen=True)
class Forwarded:
    outcome: Outcome
    status: int | None
    detail: str
    body: dict[str, Any] | None = None
    replayed: bool = False
    code: str | None = None  # the region's error code, when it refused in its error shape


def _error(content: bytes) -> tuple[str | None, str]:
    """The refusal's code (None when not in the service's error shape) and its detail."""
    try:
        error = orjson.loads(content).get("error", {})
        code, message = error.get("code"), error.get("message")
    except (orjson.JSONDecodeError, AttributeError):
        return None, content[:200].decode("utf-8", "replace")
    return (code if isinstance(code, str) else None), f"{code}: {message}"


# What is read of a region's answer: an allocation's view is a few KiB a task (GPU
# UUIDs, CPUs, the environment), so a placed answer may take 1 MiB plus 32 KiB a task;
# a refusal's error, 64 KiB. A region answering more is not read on: its body would be
# held in memory, and parsed on the event loop every request waits on.
ANSWER_BASE_BYTES = 1 << 20
ANSWER_TASK_BYTES = 32 << 10
REFUSAL_BYTES = 64 << 10


def answer_limit(tasks: int) -> int:
    """The most a placed answer of ``tasks`` tasks may take."""
    return ANSWER_BASE_BYTES + tasks * ANSWER_TASK_BYTES


@dataclass(frozen=True)
class Asked:
    """The job forwarded, as its placed answer must hold it: ``tasks`` tasks of ``gpus``
    whole GPUs each (federated jobs take no shares or MIG), no GPU twice."""

    tasks: int
    gpus: int

    @property
    def max_bytes(self) -> int:
        return answer_limit(self.tasks)


def region_client() -> httpx.AsyncClient:
    """The client forwards go out on. No cap on its connections: with one (httpx's is
    100 for all hosts together), a region taking requests and never answering held them
    all, and every forward to every other region waited for one until its time was up.
    Concurrent forwards are bounded by the requests the global service takes."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(trust_env=False, limits=limits)


async def _read(response: httpx.Response, limit: int) -> bytes | str:
    """The answer's body; or, past ``limit`` bytes or compressed, why it was not read
    (the rest is left unread)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        return f"its answer is compressed ({encoding}) though asked not to be"
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            return f"its answer is over {limit} bytes"
        chunks.append(chunk)
    return b"".join(chunks)


def allocation_of(content: bytes) -> dict[str, Any] | None:
    """The region's allocation, when the answer is one: an id and tasks, each on a named
    node with a list of GPU UUIDs (what the global answer is made of); else None."""
    try:
        answer = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("id"), str):
        return None
    tasks = answer.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        return None
    for task in tasks:
        if not isinstance(task, dict) or not isinstance(task.get("node"), str):
            return None
        uuids = task.get("gpu_uuids")
        if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids):
            return None
    return answer


def unlike(answer: dict[str, Any], asked: Asked) -> str | None:
    """How the region's allocation differs from the job asked, or None when it is that
    job. Passed on, a gang short of a task, or two tasks given one GPU, would be launched
    as if placed; the region's own /v1/place never answers one."""
    tasks = answer["tasks"]
    if len(tasks) != asked.tasks:
        return f"{len(tasks)} task(s), asked {asked.tasks}"
    for task in tasks:
        if len(task["gpu_uuids"]) != asked.gpus:
            return f"a task of {len(task['gpu_uuids'])} GPU(s), asked {asked.gpus} a task"
    uuids = [u for task in tasks for u in task["gpu_uuids"]]
    if len(set(uuids)) != len(uuids):
        return "a GPU given twice"
    return None


async def forward(
    client: httpx.AsyncClient,
    url: str,
    token: str | None,
    body: dict[str, Any],
    key: str | None,
    timeout_s: float,
    asked: Asked,
) -> Forwarded:
    """Send the placement and read the answer, all of it within ``timeout_s``; a placed
    answer counts as placed only when it is the allocation ``asked``."""
    # Asked uncompressed (and a compressed answer is not read): a few KiB of gzip could
    # unpack to any size at once, past the bound on what is read.
    if token and (bad := bearer.problem(token)) is not None:
        # Stored before the check: no header can carry it, so nothing is sent.
        return Forwarded(Outcome.UNREACHABLE, None, f"not sent: {bad}")
    headers = [(b"Content-Type", b"application/json"), (b"Accept-Encoding", b"identity")]
    if token:
        headers.append((b"Authorization", f"Bearer {token}".encode("ascii")))
    if key is not None:
        # The caller's bytes again: the key was read from its header as Latin-1 (as every
        # header is), and httpx encodes a str as ASCII, raising on a key past it.
        headers.append((b"Idempotency-Key", key.encode("latin-1")))
    # httpx's timeouts are per step (connecting, each read): an answer trickled in a
    # byte at a time never reaches them, so the whole exchange has a time of its own.
    # Connecting gets a little less, so that a region not reached within the time is
    # told apart from one that took the request (the request is sent only once connected).
    steps = httpx.Timeout(timeout_s, connect=timeout_s * 0.9, pool=timeout_s * 0.9)
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream(
                "POST",
                f"{url}/v1/place",
                content=orjson.dumps(body),
                headers=headers,
                timeout=steps,
            ) as response:
                placed = response.status_code in (200, 201)
                content = await _read(response, asked.max_bytes if placed else REFUSAL_BYTES)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        return Forwarded(Outcome.UNREACHABLE, None, f"not reachable: {exc!r}")
    except httpx.TransportError as exc:
        return Forwarded(Outcome.AMBIGUOUS, None, f"sent, no answer: {exc!r}")
    except TimeoutError:
        return Forwarded(Outcome.AMBIGUOUS, None, f"sent, no whole answer within {timeout_s:g} s")
    status = response.status_code
    if not placed:
        code, detail = _error(content if isinstance(content, bytes) else b"")
        return Forwarded(Outcome.REFUSED, status, detail, code=code)
    if isinstance(content, str):
        return Forwarded(Outcome.AMBIGUOUS, status, f"placed, but {content}")
    answer = allocation_of(content)
    if answer is None:
        return Forwarded(Outcome.AMBIGUOUS, status, "placed, but its answer is no allocation")
    differs = unlike(answer, asked)
    if differs is not None:
        # The region may hold whatever it did reserve: an answer lost, as above.
        detail = f"placed, but its answer is not the allocation asked: {differs}"
        return Forwarded(Outcome.AMBIGUOUS, status, detail)
    replayed = response.headers.get("Idempotent-Replayed") == "true"
    return Forwarded(Outcome.PLACED, status, "placed", answer, replayed)
