"""Which refused placement decisions get an audit row: one per shape a window, bounded.

A refused ``/place`` (nothing fits, or can never fit) is a decision and is
recorded (records.refused), but a client that hammers the service with an
impossible request must not turn each of its refusals into a database
write: the refusal is the cheap answer, and the log would fill with the same
row. So within one window (``TOPOPLACE_AUDIT_REFUSAL_WINDOW_S``) a *shape*,
the actor's token, the route and the request without its ``job_id`` and
``owner``, gets one row; its later refusals in the window are only counted,
and the count (``coalesced``) rides on the shape's next row. Across all
shapes at most ``TOPOPLACE_AUDIT_REFUSAL_ROWS`` rows are written a window,
so varying the request does not get round the bound either; what that cap
turns away is counted the same way. The shapes remembered are bounded too
(the least recently refused are forgotten, with their counts).

No project imports: the state holds one gate, place_flow.py asks it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

MAX_SHAPES = 10_000


@dataclass(slots=True)
class _Shape:
    written_at: float  # when its last row was admitted; -inf: never
    coalesced: int  # its refusals since then that wrote no row


class RefusalGate:
    def __init__(
        self,
        window_s: float,
        rows_per_window: int,
        *,
        max_shapes: int = MAX_SHAPES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.window_s = window_s
        self.rows_per_window = rows_per_window
        self.max_shapes = max_shapes
        self._clock = clock
        self._shapes: OrderedDict[Hashable, _Shape] = OrderedDict()
        self._window_start = float("-inf")
        self._rows_in_window = 0
        self._lock = threading.Lock()

    def admit(self, shape: Hashable) -> int | None:
        """None: no row for this refusal (counted against its shape). Else write one,
        noting this many earlier refusals of the shape that wrote none."""
        now = self._clock()
        with self._lock:
            if now - self._window_start >= self.window_s:
                self._window_start, self._rows_in_window = now, 0
            entry = self._shapes.get(shape)
            if entry is None:
                entry = self._shapes[shape] = _Shape(float("-inf"), 0)
                while len(self._shapes) > self.max_shapes:
                    self._shapes.popitem(last=False)
            else:
                self._shapes.move_to_end(shape)
            due = now - entry.written_at >= self.window_s
            if not due or self._rows_in_window >= self.rows_per_window:
                entry.coalesced += 1
                return None
            self._rows_in_window += 1
            coalesced, entry.written_at, entry.coalesced = entry.coalesced, now, 0
            return coalesced
