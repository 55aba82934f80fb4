"""The event hub: ordered, filtered, bounded, and free when nobody watches."""

from __future__ import annotations

import asyncio
import threading

import pytest

from service.events import EventHub


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
        hub.publish("allocation", "placed", allocation={"id": "x"})
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
