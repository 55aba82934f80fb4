"""A deadline for a client that stops reading its answer.

An answer is written whole into the connection's buffer, and uvicorn then
waits for the client to read it, without a limit, even past the keep-alive
timeout (a close waits for the buffer to drain): what the kernel does not
take (4 MiB on loopback) stays in the process. A client that asked for a
32 MiB answer and read nothing held 28 MiB of it, and its connection, for as
long as it stayed connected; ``GET /v1/nodes`` of 10,000 nodes is about
19 MB, and a token's rate lets it open thousands of such connections.
Here, while the transport's buffer is over its high-water
mark (the client is behind), the protocol looks every ``stalled_reader_s`` at how
much is left to send: when the client has read nothing since the last look,
the connection is aborted, its buffer dropped. A client that reads, however
slowly, makes progress and is never cut off.
"""

from __future__ import annotations

import asyncio
from typing import Any


class StalledReaderDeadline:
    """Mixed into uvicorn's protocol (before it): its ``loop`` and ``transport``, and the
    flow-control callbacks asyncio calls on it."""

    stalled_reader_s: float
    loop: asyncio.AbstractEventLoop
    transport: Any
    _stall_timer: asyncio.TimerHandle | None = None
    _left_to_send = 0

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        self._watch()

    def resume_writing(self) -> None:
        self._unwatch()
        super().resume_writing()  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self._unwatch()
        super().connection_lost(exc)  # type: ignore[misc]

    def _watch(self) -> None:
        self._unwatch()
        self._left_to_send = self.transport.get_write_buffer_size()
        self._stall_timer = self.loop.call_later(self.stalled_reader_s, self._look)

    def _unwatch(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _look(self) -> None:
        self._stall_timer = None
        if self.transport.is_closing():
            return
        if self.transport.get_write_buffer_size() < self._left_to_send:
            self._watch()  # it read some: another period
            return
        # Aborted, not closed: a close would wait for the buffer to drain, which is what
        # the client does not do. The application's pending write is released as for
        # any client gone (uvicorn marks the cycle disconnected).
        self.transport.abort()
