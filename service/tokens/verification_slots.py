"""At most so many scrypt verifications at once in the process, over every event loop.

A verification holds 16 MiB and a core for about 40 ms (secrets.py). Each
address's failures are bounded (service/edge/failed_token_budget.py), but
many addresses at once could still start as many verifications as the
worker threads allow: the REST loop's and the gRPC loop's pools, the same
threads every other request's database work waits for. So a verification
takes a slot first.

The slots are shared by REST's loop, gRPC's loop and blocking callers, so
they are not an ``asyncio.Semaphore`` (bound to one loop): a waiter is a
future of its own loop, woken from whichever thread frees a slot, and a
blocking caller waits on an event. A waiter waits on its loop, not on a
worker thread. The slot is held by the worker thread that verifies and freed
when the verification ends, not when the request that asked for it is
cancelled (the thread runs on): the bound is on computations, not requests.

A caller that gets no slot within ``wait_s`` (or finds ``MAX_WAITING``
already waiting) is answered 429 ``rate_limited`` with Retry-After 1: the
process is busy verifying first-seen tokens; clients already back off on it,
and no read or hash was spent on the caller. Tokens verified before never
take a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import TypeVar

from service.errors import RateLimited
from service.event_loop import off_loop

# Two cores' worth: the hashes of a restart's first calls still run at full speed, and
# the event loops keep a core between them on a small machine.
DEFAULT_AT_ONCE = 2
# Long enough for 50 verifications of 2 slots ahead of a caller; past it, Retry-After.
DEFAULT_WAIT_S = 1.0
MAX_WAITING = 1000

Result = TypeVar("Result")


class _Waiter:
    """One caller waiting for a slot; :meth:`wake` hands it one (from any thread)."""

    def wake(self) -> None:
        raise NotImplementedError


class VerificationSlots:
    def __init__(self, at_once: int = DEFAULT_AT_ONCE, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.at_once = at_once
        self.wait_s = wait_s
        self._free = at_once
        self._waiting: deque[_Waiter] = deque()
        self._lock = threading.Lock()

    def free(self) -> int:
        with self._lock:
            return self._free

    # -- taking a slot --------------------------------------------------------

    def _take_or_queue(self, waiter: _Waiter) -> bool:
        """True when a slot was free (taken); else ``waiter`` is queued."""
        with self._lock:
            if self._free > 0:
                self._free -= 1
                return True
            if len(self._waiting) >= MAX_WAITING:
                raise self._busy()
            self._waiting.append(waiter)
            return False

    def _unqueue(self, waiter: _Waiter) -> bool:
        """True when ``waiter`` was still queued (now not); False when a slot is already
        on its way to it."""
        with self._lock:
            try:
                self._waiting.remove(waiter)
            except ValueError:
                return False
            return True

    def release(self) -> None:
        """Free a slot: the longest waiter's now, else back to the free ones."""
        with self._lock:
            if not self._waiting:
                self._free += 1
                return
            waiter = self._waiting.popleft()
        waiter.wake()

    def _busy(self) -> RateLimited:
        return RateLimited(
            f"this service is verifying as many new tokens as it may at once"
            f" ({self.at_once}, TOPOPLACE_TOKEN_VERIFICATIONS_AT_ONCE) and none was done"
            f" within {self.wait_s:g} s: retry",
            retry_after=1,
            detail={"verifications_at_once": self.at_once},
        )

    # -- on an event loop -----------------------------------------------------

    async def run(self, blocking: Callable[..., Result], *args: object) -> Result:
        """``blocking(*args)`` on a worker thread of the running loop, holding a slot from
        before it starts until it returns, even when this caller is cancelled meanwhile."""
        await self._acquire()
        # No await between the slot and the task: nothing can cancel in between.
        work = asyncio.ensure_future(self._holding(blocking, *args))
        return await asyncio.shield(work)

    async def _holding(self, blocking: Callable[..., Result], *args: object) -> Result:
        try:
            return await off_loop(blocking, *args)
        finally:
            self.release()

    async def _acquire(self) -> None:
        waiter = _LoopWaiter(self, asyncio.get_running_loop())
        if self._take_or_queue(waiter):
            return
        try:
            await asyncio.wait((waiter.future,), timeout=self.wait_s)
        except BaseException:  # cancelled while waiting
            if waiter.settle():
                self.release()
            raise
        if not waiter.settle():
            raise self._busy()

    # -- on a thread ------------------------------------------------------------

    @contextlib.contextmanager
    def held_blocking(self) -> Iterator[None]:
        """A slot for the body's time, waiting on this thread."""
        waiter = _ThreadWaiter(self)
        if not self._take_or_queue(waiter) and not waiter.wait(self.wait_s):
            raise self._busy()
        try:
            yield
        finally:
            self.release()


class _LoopWaiter(_Waiter):
    def __init__(self, slots: VerificationSlots, loop: asyncio.AbstractEventLoop) -> None:
        self.slots = slots
        self.loop = loop
        self.future: asyncio.Future[None] = loop.create_future()

    def wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self._grant)
        except RuntimeError:  # its loop is closed: nobody will use the slot
            self.slots.release()

    def _grant(self) -> None:  # on the waiter's loop
        if self.future.done():  # it gave up (timed out, cancelled) after it was woken
            self.slots.release()
        else:
            self.future.set_result(None)

    def settle(self) -> bool:
        """On the waiter's loop, once it stops waiting: whether it holds a slot. One that
        does not is out of the queue, or its slot, on the way, passes on (``_grant``)."""
        if self.future.done() and not self.future.cancelled():
            return True
        if not self.slots._unqueue(self):
            self.future.cancel()  # woken, its _grant not run yet: it will pass the slot on
        return False


class _ThreadWaiter(_Waiter):
    def __init__(self, slots: VerificationSlots) -> None:
        self.slots = slots
        self._woken = threading.Event()
        self._gave_up = False
        self._mutex = threading.Lock()

    def wake(self) -> None:
        with self._mutex:
            gave_up = self._gave_up
            if not gave_up:
                self._woken.set()
        if gave_up:
            self.slots.release()

    def wait(self, seconds: float) -> bool:
        """Whether a slot came within ``seconds`` (this thread holds it then)."""
        if self._woken.wait(seconds) or not self.slots._unqueue(self):
            with self._mutex:  # woken, or being woken now
                if self._woken.is_set():
                    return True
                self._gave_up = True  # wake() passes the slot on
        return False
