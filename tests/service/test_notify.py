"""The replica listener: what a resync finds reaches this process's watchers."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest

from service import notify
from service.events import EventHub


class _State:
    """A follower whose database differs from memory on the nodes it is given."""

    def __init__(self, differ: list[str]) -> None:
        self.events = EventHub()
        self.differ = differ

    def resync(self) -> list[str]:
        return list(self.differ)

    def sync_nodes(self, names: list[str] | None) -> None:
        pass


class _Connection:
    """LISTENs, then hears nothing: the listener stops at its first wait."""

    def __init__(self, listener: notify.Listener) -> None:
        self.listener = listener

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def execute(self, *args: Any) -> None:
        pass

    def notifies(self, timeout: float, stop_after: int) -> list[Any]:
        self.listener._stop.set()
        return []


def _heard(differ: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str | None]]:
    """The events a watcher sees while the listener connects (and resyncs) once."""
    state = _State(differ)
    listener = notify.Listener("postgresql://unused", state)
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: _Connection(listener))

    async def run() -> list[tuple[str, str | None]]:
        sub = state.events.subscribe(["node"])
        await sub.next()  # started
        await asyncio.to_thread(listener._run)
        state.events.publish("node", "reported", node="end")  # a marker: all before it came
        seen = []
        while (event := await sub.next()) is not None and event.node != "end":
            seen.append((event.type, event.node))
        sub.close()
        return seen

    return asyncio.run(run())


def test_a_change_missed_while_reconnecting_reaches_watchers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another replica released GPUs on h1 while this one's listener was reconnecting:
    the resync at reconnect reads it, and a watcher hears of it (it kept them held)."""
    assert _heard(["h1", "h2"], monkeypatch) == [("changed", "h1"), ("changed", "h2")]


def test_a_resync_that_finds_many_nodes_changed_asks_watchers_to_list_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    many = [f"n{i:04d}" for i in range(notify._MAX_NODES + 1)]
    assert _heard(many, monkeypatch) == [("resync", None)]


def test_a_resync_that_finds_nothing_tells_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _heard([], monkeypatch) == []


@pytest.mark.parametrize(
    "payload", ["[]", "1", '"x"', "null", '{"nodes": "gpu-a"}', '{"nodes": 5}', '{"nodes": [1]}']
)
def test_a_payload_not_naming_nodes_is_ignored_with_one_warning(
    payload: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Anyone who can connect to the database can NOTIFY the channel: JSON that is not
    an object raised AttributeError, which dropped the listener's connection (changes
    were missed until it reconnected), and a string of nodes was read as one node per
    character. Such a payload names no node to sync and is logged."""
    with caplog.at_level(logging.WARNING, logger="topoplace.notify"):
        assert notify.parse(payload) == []
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_a_payload_naming_nodes_names_them() -> None:
    assert notify.parse('{"origin": "elsewhere", "nodes": ["gpu-a", "gpu-b"]}') == [
        "gpu-a",
        "gpu-b",
    ]
    assert notify.parse('{"origin": "elsewhere"}') is None


class _Following(_State):
    """A follower that records the nodes it is asked to read again."""

    def __init__(self) -> None:
        super().__init__([])
        self.synced: list[list[str] | None] = []

    def sync_nodes(self, names: list[str] | None) -> None:
        self.synced.append(names)


class _OneMessage(_Connection):
    """Hears one message from another replica naming h1, then nothing."""

    def __init__(self, listener: notify.Listener) -> None:
        super().__init__(listener)
        self.sent = False

    def notifies(self, timeout: float, stop_after: int) -> list[Any]:
        if timeout == 0.0:
            return []
        if self.sent:
            return super().notifies(timeout, stop_after)
        self.sent = True
        payload = '{"origin": "another replica", "nodes": ["h1"], "at": 1.0}'
        return [psycopg.Notify(notify.CHANNEL, payload, 1)]


def test_a_message_heard_as_the_resync_falls_due_is_read_and_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every 30 s the resync fell due in an iteration that had heard messages, and ran
    instead of reading their nodes: a resync re-reads only nodes whose snapshot, cordon
    or held devices look different, so a node this replica had read already (its own
    lost race reads the winner's holds) or whose change left those alike (host figures)
    was not read, and its watchers never heard that another replica changed it."""
    monkeypatch.setattr(notify, "RESYNC_S", 0.0)
    state = _Following()
    listener = notify.Listener("postgresql://unused", state)
    monkeypatch.setattr(psycopg, "connect", lambda *a, **k: _OneMessage(listener))

    async def run() -> list[tuple[str, str | None]]:
        sub = state.events.subscribe(["node"])
        await sub.next()  # started
        await asyncio.to_thread(listener._run)
        state.events.publish("node", "reported", node="end")
        seen = []
        while (event := await sub.next()) is not None and event.node != "end":
            seen.append((event.type, event.node))
        sub.close()
        return seen

    assert asyncio.run(run()) == [("changed", "h1")]
    assert state.synced == [["h1"]]


def test_the_listener_connects_with_the_options_the_url_gives(postgres_url: str) -> None:
    # A URL's ?options=-c statement_timeout=5000 reached libpq as "-c+statement_timeout=5000"
    # (a URI's query does not read "+" as a space): the server refused every connection,
    # and the replica's listener reconnected for ever, hearing no other replica.
    import sqlalchemy as sa

    given = sa.make_url(postgres_url).update_query_dict({"options": "-c statement_timeout=5000"})
    dsn = notify.psycopg_dsn(given.render_as_string(hide_password=False))
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("5s",)
