"""At most so many scrypt verifications at once in the process, over every event loop.

Each verification holds 16 MiB and a core for about 40 ms: a flood of first-seen
tokens from many addresses ran as many at once as there were worker threads (the
REST loop's and the gRPC loop's), starving the other requests' database work.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from service import migrate
from service.access import Role
from service.app import create_app
from service.auth import Principal
from service.db import make_engine
from service.errors import RateLimited
from service.settings import Settings
from service.tokens import secrets, store
from service.tokens.verification_slots import VerificationSlots


@dataclass
class Overlap:
    """How many verifications ran at once, at most."""

    running: int = 0
    most: int = 0

    def __post_init__(self) -> None:
        self.lock = threading.Lock()


def watch_overlap(monkeypatch: pytest.MonkeyPatch, seconds: float) -> Overlap:
    overlap = Overlap()
    real = secrets.verify_secret

    def slow(secret: str, stored: str) -> bool:
        with overlap.lock:
            overlap.running += 1
            overlap.most = max(overlap.most, overlap.running)
        try:
            time.sleep(seconds)  # long enough for every request to have arrived
            return real(secret, stored)
        finally:
            with overlap.lock:
                overlap.running -= 1

    monkeypatch.setattr(secrets, "verify_secret", slow)
    return overlap


@pytest.fixture
def tokens(database_url: str) -> Iterator[list[str]]:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    yield [store.create(engine, Role.VIEWER, name=f"v{n}")[1] for n in range(8)]
    engine.dispose()


def test_verifications_at_once_are_bounded_over_both_loops(
    database_url: str, tokens: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(
        database_url=database_url,
        insecure_dev=False,
        token_verifications_at_once=2,
        token_verification_wait_s=30,
    )
    check = create_app(settings, background=False).state.token_check
    overlap = watch_overlap(monkeypatch, 0.1)
    found: list[Principal] = []

    async def first_sight(half: list[str]) -> list[Principal]:
        return await asyncio.gather(*(check.authenticate_async(f"Bearer {t}") for t in half))

    # Two event loops on two threads, as REST's and gRPC's.
    def loop(half: list[str]) -> None:
        found.extend(asyncio.run(first_sight(half)))

    threads = [threading.Thread(target=loop, args=(tokens[n::2],)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == len(tokens)
    assert overlap.most == 2
    check.engine.dispose()


def test_the_blocking_check_shares_the_bound(
    database_url: str, tokens: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(database_url=database_url, insecure_dev=False)
    check = create_app(settings, background=False).state.token_check
    check.verifications = VerificationSlots(1, wait_s=30)
    overlap = watch_overlap(monkeypatch, 0.05)
    threads = [
        threading.Thread(target=check.authenticate, args=(f"Bearer {t}",)) for t in tokens[:4]
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert overlap.most == 1
    check.engine.dispose()


def test_a_wait_past_its_bound_is_answered_429() -> None:
    slots = VerificationSlots(1, wait_s=0.05)

    async def contend() -> list[BaseException | None]:
        outcomes = await asyncio.gather(
            slots.run(time.sleep, 0.3), slots.run(time.sleep, 0.3), return_exceptions=True
        )
        return [o if isinstance(o, BaseException) else None for o in outcomes]

    first, second = asyncio.run(contend())
    assert first is None
    assert isinstance(second, RateLimited) and second.retry_after == 1
    assert second.status == 429 and second.code == "rate_limited"
    assert slots.free() == 1  # the one that gave up took nothing with it


def test_a_slot_passes_to_the_next_waiter_on_another_loop() -> None:
    slots = VerificationSlots(1, wait_s=10)
    order: list[str] = []
    held = threading.Event()

    def work(name: str, seconds: float) -> None:
        order.append(name)
        held.set()
        time.sleep(seconds)

    other = threading.Thread(target=asyncio.run, args=(slots.run(work, "first", 0.1),))
    other.start()
    held.wait()
    asyncio.run(slots.run(work, "second", 0))
    other.join()
    assert order == ["first", "second"]
    assert slots.free() == 1


def test_a_slot_is_held_until_its_work_ends_though_its_caller_is_cancelled() -> None:
    slots = VerificationSlots(1, wait_s=10)
    running = threading.Event()

    def work() -> None:
        running.set()
        time.sleep(0.2)

    async def cancel_midway() -> int:
        caller = asyncio.ensure_future(slots.run(work))
        await asyncio.to_thread(running.wait)
        caller.cancel()
        await asyncio.gather(caller, return_exceptions=True)
        held_meanwhile = slots.free()
        await asyncio.sleep(0.4)
        return held_meanwhile

    assert asyncio.run(cancel_midway()) == 0  # the thread still verifies
    assert slots.free() == 1


def test_waiters_cancelled_or_timed_out_leave_no_slot_behind() -> None:
    slots = VerificationSlots(2, wait_s=0.02)

    async def churn() -> None:
        tasks = [asyncio.ensure_future(slots.run(time.sleep, 0.01 * (n % 4))) for n in range(40)]
        await asyncio.sleep(0.005)
        for task in tasks[::3]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0.1)  # the cancelled callers' work ends

    for _ in range(5):
        asyncio.run(churn())
    assert slots.free() == 2


def test_a_blocking_waiter_is_answered_429_past_its_bound() -> None:
    slots = VerificationSlots(1, wait_s=0.05)
    with slots.held_blocking():
        outcome: list[BaseException] = []

        def second() -> None:
            try:
                with slots.held_blocking():
                    pass
            except RateLimited as refused:
                outcome.append(refused)

        thread = threading.Thread(target=second)
        thread.start()
        thread.join()
    assert len(outcome) == 1
    assert slots.free() == 1
