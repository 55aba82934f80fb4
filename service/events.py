"""An in-process hub of allocation and node events, for watchers (the gRPC Watch stream).

Publishers are the allocations API (service/allocations/api.py: one event
per change, whoever made it), the node operations (service/nodes/observed.py)
and the replica listener, on whichever thread or loop they run; subscribers
are coroutines on some event loop. :meth:`EventHub.publish` never blocks and never waits for a
subscriber: each subscription has a bounded buffer, and one that falls more
than ``maxsize`` events behind is closed as overflowed (the watcher lists
again and watches again) rather than letting a slow reader grow memory
without limit or slow down the writers.

Events say what changed in this process, or that another replica changed a
node (``changed``): the database stays the authority, as for the in-memory
state (service/notify.py).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from service.allocations.results import Allocation
from service.errors import TooManyWatches

EventKind = Literal["watch", "allocation", "node"]
KINDS: frozenset[str] = frozenset({"allocation", "node"})
DEFAULT_BUFFER = 1024
DEFAULT_MAX_WATCHES = 256
DEFAULT_MAX_PER_CALLER = 16
# How far along its life an allocation event's allocation is: an event carrying an
# earlier stage than one already sent for that allocation is stale (see EventHub.publish).
STAGES: dict[str, int] = {
    "pending": 0,
    "active": 1,
    "degraded": 1,
    "released": 2,
    "expired": 2,
}
# Allocations whose latest stage is remembered; the oldest is forgotten past it (a
# publisher is late by one commit at most, never by thousands of allocations).
REMEMBERED_ALLOCATIONS = 4096
# Told of every event as it is published, watched or not: (kind, type, how many).
Tally = Callable[[str, str, int], None]


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    at: datetime
    kind: EventKind
    type: str
    allocation: Allocation | None = None  # the allocation after the change
    node: str | None = None


@dataclass(eq=False)
class Subscription:
    """One watcher's buffer; read with :meth:`next` on the loop that subscribed."""

    hub: EventHub
    kinds: frozenset[str]
    maxsize: int
    loop: asyncio.AbstractEventLoop
    caller: str | None = None  # the token it was opened with (None: no token)
    _buffer: deque[Event] = field(default_factory=deque)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    overflowed: bool = False
    closed: bool = False

    def _offer(self, event: Event) -> None:  # runs on self.loop
        if self.closed:
            return
        if len(self._buffer) >= self.maxsize:
            self.overflowed = True
            self._end()
            return
        self._buffer.append(event)
        self._ready.set()

    def _end(self) -> None:
        """No more events, and the buffer freed; still counted until :meth:`close`."""
        self.closed = True
        self._buffer.clear()
        self._ready.set()
        self.hub._unsubscribe(self)

    async def next(self) -> Event | None:
        """The next event; None once the subscription is closed (see ``overflowed``)."""
        while not self._buffer:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        return self._buffer.popleft()

    def close(self) -> None:
        """The watcher is done with it (its stream ended): it no longer counts."""
        self._end()
        self.hub._drop(self)


class EventHub:
    """``tally``: told of every event, watched or not (/metrics counts them there, so that
    what it counts and what a watcher sees are one stream)."""

    def __init__(
        self,
        buffer: int = DEFAULT_BUFFER,
        tally: Tally | None = None,
        max_watches: int = DEFAULT_MAX_WATCHES,
        max_per_caller: int = DEFAULT_MAX_PER_CALLER,
    ) -> None:
        self.buffer = buffer
        self._tally = tally
        # Every subscription is handed every event under the lock, on the writers' path,
        # and may hold a full buffer: their number is bounded, per caller and in all.
        self.max_watches = max_watches
        self.max_per_caller = max_per_caller
        self._lock = threading.Lock()
        self._subscriptions: list[Subscription] = []  # handed events
        # Counted against the bounds, from subscribe to close: one that fell behind is
        # handed no more events, but its stream is open until its watcher reads to the
        # end (a client that reads nothing keeps it blocked writing): uncounted, a token
        # held as many such streams as it opened.
        self._open: list[Subscription] = []
        self._seq = itertools.count(1)
        self._stages: OrderedDict[str, int] = OrderedDict()

    @property
    def watched(self) -> bool:
        """Whether anyone listens: publishers skip building events when nobody does."""
        return bool(self._subscriptions)

    def subscribe(
        self, kinds: Iterable[str] = KINDS, maxsize: int | None = None, caller: str | None = None
    ) -> Subscription:
        """Subscribe the running event loop; the first event is ``watch``/``started``.
        ``caller``: the token opening it; raises TooManyWatches past either bound."""
        wanted = frozenset(kinds) or KINDS
        unknown = wanted - KINDS
        if unknown:
            raise ValueError(f"unknown event kinds {sorted(unknown)}; known: {sorted(KINDS)}")
        loop = asyncio.get_running_loop()
        sub = Subscription(self, wanted, maxsize or self.buffer, loop, caller)
        with self._lock:
            self._admit(caller)
            self._subscriptions.append(sub)
            self._open.append(sub)
            started = self._event("watch", "started")
        sub._offer(started)
        return sub

    def _admit(self, caller: str | None) -> None:
        """Refuse one more subscription past a bound; called with the lock held."""
        if len(self._open) >= self.max_watches:
            raise TooManyWatches(
                f"this service already serves {self.max_watches} watches, its bound"
                " (TOPOPLACE_MAX_WATCHES); retry later, or share one watch between readers",
                {"limit": self.max_watches, "scope": "service"},
            )
        mine = sum(1 for s in self._open if s.caller == caller)
        if mine >= self.max_per_caller:
            raise TooManyWatches(
                f"this token already holds {self.max_per_caller} open watches, its bound"
                " (TOPOPLACE_MAX_WATCHES_PER_CALLER); end one first, or share one between"
                " readers",
                {"limit": self.max_per_caller, "scope": "caller"},
            )

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

    def _drop(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)
            if sub in self._open:
                self._open.remove(sub)

    def _event(
        self,
        kind: EventKind,
        type_: str,
        allocation: Allocation | None = None,
        node: str | None = None,
    ) -> Event:
        return Event(next(self._seq), datetime.now(UTC), kind, type_, allocation, node)

    def publish(
        self,
        kind: EventKind,
        type_: str,
        *,
        allocation: Allocation | None = None,
        node: str | None = None,
    ) -> None:
        """Hand an event to every subscriber of its kind; safe from any thread."""
        if self._tally is not None:
            self._tally(kind, type_, 1)
        with self._lock:  # held while handing over, so every watcher sees seq in order
            if allocation is not None and self._stale(allocation):
                return
            if not self._subscriptions:
                return
            event = self._event(kind, type_, allocation, node)
            for sub in list(self._subscriptions):
                if kind not in sub.kinds:
                    continue
                try:
                    sub.loop.call_soon_threadsafe(sub._offer, event)
                except RuntimeError:  # its loop is closed: the watcher is gone
                    self._subscriptions.remove(sub)
                    if sub in self._open:
                        self._open.remove(sub)

    def _stale(self, allocation: Allocation) -> bool:
        """Whether this allocation event is older than one already published for it;
        called with the lock held. Each change publishes after its own commit, so two
        requests on one allocation can publish in the other order (a release answered
        before the place that made it has published ``placed``): a watcher that saw
        ``released`` must not then see the allocation pending again. An event at the
        same stage (extended, moved) still goes out."""
        stage = STAGES.get(allocation.state)
        if stage is None:
            return False
        sent = self._stages.get(allocation.id)
        if sent is not None and stage < sent:
            return True
        self._remember(allocation.id, stage)
        return False

    def _remember(self, allocation_id: str, stage: int) -> None:
        """That an event at ``stage`` went out for this allocation; with the lock held."""
        sent = self._stages.get(allocation_id)
        self._stages[allocation_id] = stage if sent is None else max(stage, sent)
        self._stages.move_to_end(allocation_id)
        if len(self._stages) > REMEMBERED_ALLOCATIONS:
            self._stages.popitem(last=False)

    def unwatched(self, kind: EventKind, type_: str, count: int, ended: Iterable[str] = ()) -> None:
        """``count`` events that nobody watches, tallied without being built: a publisher
        whose events cost a read to build (service/allocations/api.py) skips the read.
        ``ended``: the allocations these events end, remembered as ended all the same: a
        watcher that subscribes next and lists sees them ended, and a late ``placed``
        published for one of them must not show it to that watcher pending again."""
        if self._tally is not None and count:
            self._tally(kind, type_, count)
        with self._lock:
            for allocation_id in ended:
                self._remember(allocation_id, STAGES["released"])

    def close_all(self) -> None:
        """End every subscription (the server is stopping): their streams end cleanly."""
        with self._lock:
            subscriptions = list(self._open)
        for sub in subscriptions:
            try:
                sub.loop.call_soon_threadsafe(sub.close)
            except RuntimeError:  # its loop is closed already
                self._drop(sub)

    def nodes(self, type_: str, names: Iterable[str]) -> None:
        for name in names:
            self.publish("node", type_, node=name)
