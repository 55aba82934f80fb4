"""A keyless Place whose call ended before its answer: its reservation is released.

A client whose deadline passed, or that cancelled, learns no allocation id,
and without an Idempotency-Key it cannot find the reservation again: its
retry reserves a second one while the first holds its GPUs until its TTL
(300 s by default). grpc.aio cancels the handler when the call ends, but the
decision and its commit run on a worker thread that goes on; whichever of
the two finishes second (the thread with its reservation, the handler with
its cancellation) releases it. A Place sent with a key keeps its reservation:
the retry under the key is answered with it.

Left open: an answer already handed to grpc whose client's deadline passes
before it arrives. That reservation stays pending and expires after its TTL.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading

from service.allocations import api as allocations
from service.state import ServiceState

log = logging.getLogger("topoplace.grpc")


class Handover:
    """Between one Place's worker thread and its handler: who saw the other finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._made: str | None = None

    def made(self, allocation_id: str) -> bool:
        """The worker's reservation; True when the call is over already (release it)."""
        with self._lock:
            if self._abandoned:
                return True
            self._made = allocation_id
            return False

    def abandon(self) -> str | None:
        """The call ended before its answer: the reservation made for it, if any, to
        release (later ones are refused to the worker by ``made``)."""
        with self._lock:
            self._abandoned = True
            made, self._made = self._made, None
            return made


def release(state: ServiceState, allocation_id: str) -> None:
    """Release on the worker thread it runs on (the call's audit actor is in context)."""
    try:
        allocations.release(state, allocation_id)
    except Exception:
        # Confirmed or released meanwhile by someone who listed it: theirs now; or the
        # database did not answer: the TTL ends it.
        log.warning("could not release abandoned reservation %s", allocation_id, exc_info=True)


def release_later(state: ServiceState, allocation_id: str) -> None:
    """``release`` from a handler being cancelled, which cannot await: on the loop's
    worker pool, not awaited (the server waits for its pool when it stops)."""
    context = contextvars.copy_context()
    # Not awaited: ``release`` logs its own failures.
    asyncio.get_running_loop().run_in_executor(None, context.run, release, state, allocation_id)
