"""The event hub: ordered, filtered, bounded, and free when nobody watches."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime

import pytest

from service.allocations.results import Allocation
from service.events import REMEMBERED_ALLOCATIONS, EventHub


def _allocation(allocation_id: str, state: str) -> Allocation:
    now = datetime.now(UTC)
    ended = now if state in ("released", "expired") else None
    return Allocation(allocation_id, state, None, None, (), 0.0, None, (), "", now, None, ended)  # type: ignore[arg-type]


def test_nothing_is_built_when_nobody_watches() -> None:
    hub = EventHub()
    hub.publish("node", "reported", node="a")
    assert not hub.watched


def test_events_arrive_in_order_from_many_threads() -> None:
    async def run() -> list[int]:
        hub = EventHub(buffer=10_000)
        sub = hub.subscribe()
        first = await sub.next()
        assert first is not None and first.type == "started"

        def burst(k: int) -> None:
            for i in range(200):
                hub.publish("node", "reported", node=f"{k}-{i}")

        threads = [threading.Thread(target=burst, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        await asyncio.to_thread(lambda: [t.join() for t in threads])
        seqs = []
        for _ in range(800):
            event = await sub.next()
            assert event is not None
            seqs.append(event.seq)
        sub.close()
        assert not hub.watched
        return seqs

    seqs = asyncio.run(run())
    assert seqs == sorted(seqs) and len(set(seqs)) == 800


def test_kinds_are_filtered_and_checked() -> None:
    async def run() -> None:
        hub = EventHub()
        sub = hub.subscribe(["allocation"])
        await sub.next()
        hub.publish("node", "reported", node="a")
        hub.publish("allocation", "placed", allocation=_allocation("x", "pending"))
        event = await sub.next()
        assert event is not None and event.type == "placed"
        with pytest.raises(ValueError, match="unknown event kinds"):
            hub.subscribe(["gpus"])

    asyncio.run(run())


def test_a_reader_that_falls_behind_is_closed_and_its_buffer_freed() -> None:
    async def run() -> None:
        hub = EventHub(buffer=4)
        slow = hub.subscribe()
        fast = hub.subscribe(maxsize=100)
        for i in range(10):
            hub.publish("node", "reported", node=str(i))
        await asyncio.sleep(0)  # let the hand-overs run
        await asyncio.sleep(0)
        assert await slow.next() is None and slow.overflowed
        seen = [await fast.next() for _ in range(11)]
        assert [e.type for e in seen if e is not None] == ["started"] + ["reported"] * 10
        assert hub.watched  # the fast one still listens
        fast.close()
        assert not hub.watched

    asyncio.run(run())


def test_an_event_older_than_one_sent_for_its_allocation_is_not_sent() -> None:
    """A release answered before its place published ``placed``: the watcher sees the
    release, then nothing that says the allocation is live again."""

    async def run() -> list[tuple[str, str, str]]:
        hub = EventHub()
        sub = hub.subscribe(["allocation"])
        await sub.next()
        hub.publish("allocation", "released", allocation=_allocation("a", "released"))
        hub.publish("allocation", "placed", allocation=_allocation("a", "pending"))
        hub.publish("allocation", "confirmed", allocation=_allocation("a", "active"))
        hub.publish("allocation", "placed", allocation=_allocation("b", "active"))
        hub.publish("allocation", "moved", allocation=_allocation("b", "degraded"))
        hub.publish("allocation", "extended", allocation=_allocation("b", "active"))
        hub.publish("allocation", "placed", allocation=_allocation("b", "pending"))
        hub.publish("allocation", "expired", allocation=_allocation("b", "expired"))
        seen = []
        for _ in range(5):
            event = await sub.next()
            assert event is not None and event.allocation is not None
            seen.append((event.type, event.allocation.id, event.allocation.state))
        sub.close()
        return seen

    assert asyncio.run(run()) == [
        ("released", "a", "released"),
        ("placed", "b", "active"),
        ("moved", "b", "degraded"),
        ("extended", "b", "active"),
        ("expired", "b", "expired"),
    ]


def test_the_stages_remembered_are_bounded() -> None:
    hub = EventHub()
    for i in range(REMEMBERED_ALLOCATIONS + 10):
        hub.publish("allocation", "released", allocation=_allocation(f"a{i}", "released"))
    assert len(hub._stages) == REMEMBERED_ALLOCATIONS
    assert "a0" not in hub._stages and f"a{REMEMBERED_ALLOCATIONS + 9}" in hub._stages
