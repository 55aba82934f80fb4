"""Keeping several service processes on one Postgres in step.

Every write that changes what is held or what a node looks like sends a
Postgres notification in the same transaction (so it is delivered exactly
when the change commits, and never for a rolled-back one). Each process
listens on its own connection and re-reads the named nodes from the
database: their snapshot, cordon state and GPU holds. The database stays the
authority; the message only says where to look, so a lost or duplicated
message costs at most a stale read until the next one, and a periodic full
resync bounds even that.

SQLite has no notifications; an embedded SQLite service is one process.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Protocol

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from service.db import postgres_connect_args
from service.events import EventHub

log = logging.getLogger("topoplace.notify")

CHANNEL = "topoplace"
ORIGIN = uuid.uuid4().hex  # this process; its own messages are skipped
_MAX_NODES = 200  # beyond this a message asks for a full reload (payloads are capped at 8 kB)
RESYNC_S = 30.0
_DRAIN = 511  # messages taken in one go after the first


def message(nodes: Iterable[str]) -> str | None:
    """The payload announcing that these nodes changed; None when there are none. ``at``
    (the sender's wall clock) lets a listener measure how late it applies the change."""
    names = sorted(set(nodes))
    if not names:
        return None
    listed = names if len(names) <= _MAX_NODES else None
    return json.dumps({"origin": ORIGIN, "nodes": listed, "at": round(time.time(), 6)})


def publish(conn: Connection, nodes: Iterable[str]) -> None:
    """Announce, inside the caller's transaction, that these nodes changed."""
    if conn.dialect.name != "postgresql":
        return
    body = message(nodes)
    if body is not None:
        statement = sa.text("SELECT pg_notify(:channel, :body)")
        conn.execute(statement, {"channel": CHANNEL, "body": body})


def sent_at(payload: str) -> float | None:
    """The sender's clock in a message (seconds since the epoch); None when it has none."""
    try:
        at = json.loads(payload).get("at")
    except (json.JSONDecodeError, AttributeError):
        return None
    return float(at) if isinstance(at, int | float) and not isinstance(at, bool) else None


def parse(payload: str) -> list[str] | None:
    """The nodes a message names; None for "reload everything"; [] for our own message."""
    try:
        body = json.loads(payload)
    except json.JSONDecodeError:
        return None
    # Anyone who may connect can NOTIFY: a payload not of our shape is ignored, not raised
    # (which dropped this connection, and the changes sent until it was back).
    if not isinstance(body, dict):
        log.warning("notification ignored: not a JSON object (%.80r)", payload)
        return []
    if body.get("origin") == ORIGIN:
        return []
    nodes = body.get("nodes")
    if nodes is None:
        return None
    if not isinstance(nodes, list) or not all(isinstance(n, str) for n in nodes):
        # A string would be read as one node per character.
        log.warning("notification ignored: nodes is not a list of names (%.80r)", payload)
        return []
    return nodes


class Follower(Protocol):
    """What the listener keeps in step with the database: the service state
    (service/state.py). Named here by what the listener asks of it, so that this
    module, which the state's writers import, never imports the state."""

    @property
    def events(self) -> EventHub: ...

    def resync(self) -> list[str]: ...

    def sync_nodes(self, names: list[str] | None) -> None: ...


class Listener:
    """A thread with its own connection, LISTENing and syncing the state it is given.

    ``on_lag`` is told, for each message from another replica, the seconds from its
    sending (the sender's clock, so clocks out of step by more than the lag show as
    skew) to this replica having read the change (/metrics' notification lag)."""

    def __init__(
        self, dsn: str, state: Follower, on_lag: Callable[[float], None] | None = None
    ) -> None:
        self.dsn = dsn
        self.state = state
        self.on_lag = on_lag
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="topoplace-listen", daemon=True)
        self.ready = threading.Event()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    # Anything missed while we were not listening: read it all once.
                    caught_up(self.state)
                    self.ready.set()
                    self._listen(conn)
            except Exception:
                log.exception("notification listener lost its connection; reconnecting")
                self._stop.wait(1.0)

    def _listen(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        last_resync = time.monotonic()
        while not self._stop.is_set():
            # Wait for the first message (or a second, to look at the stop flag and
            # the resync clock), then take at once whatever else has arrived: a change
            # is applied as soon as it is heard, several at a time under load, never
            # held back to gather more. Gathering for a second made other replicas'
            # releases a second late, and 3% of /place calls lost a race to them.
            notes = list(conn.notifies(timeout=1.0, stop_after=1))
            if notes:
                notes += conn.notifies(timeout=0.0, stop_after=_DRAIN)
            wanted: set[str] = set()
            reload_all = False
            sent: list[float] = []
            for note in notes:
                nodes = parse(note.payload)
                at = sent_at(note.payload) if nodes != [] else None  # not our own
                if at is not None:
                    sent.append(at)
                if nodes is None:
                    reload_all = True
                else:
                    wanted.update(nodes)
            if reload_all:  # another replica changed many nodes: watchers list again
                self.state.resync()
                last_resync = time.monotonic()
                self.state.events.publish("node", "resync")
                wanted.clear()
            if wanted:
                # Read and told even when the resync falls due now: it re-reads only the
                # nodes that look different (snapshot, cordon, held devices), not one
                # this replica read already (its lost race reads the winner's holds) or
                # whose change left those alike, and watchers never heard of it.
                self.state.sync_nodes(sorted(wanted))
                # Another replica changed these (holds, snapshot, cordon): tell watchers.
                self.state.events.nodes("changed", sorted(wanted))
            if not reload_all and time.monotonic() - last_resync >= RESYNC_S:
                caught_up(self.state)
                last_resync = time.monotonic()
            if self.on_lag is not None:
                applied = time.time()
                for at in sent:
                    self.on_lag(applied - at)


def caught_up(state: Follower) -> None:
    """Resync, and tell watchers of the nodes it found changed (``changed``; ``resync``
    past ``_MAX_NODES``, as a message naming that many would). A resync finds what no
    notification told this process (one missed while its listener reconnected, or
    lost): without an event a watcher kept, for good, a picture the
    database no longer holds, such as GPUs held by an allocation another replica ended.
    """
    changed = state.resync()
    if len(changed) > _MAX_NODES:
        state.events.publish("node", "resync")
    elif changed:
        state.events.nodes("changed", changed)


def psycopg_dsn(database_url: str) -> str:
    """The libpq form of a SQLAlchemy URL (drop the +driver), with the service's
    connection limits: a LISTEN connection whose peer vanished would otherwise wait
    for notifications that never come (``service.db.postgres_connect_args``)."""
    url = sa.make_url(database_url)
    # A conninfo string, not a URI: a URI's query is written with "+" for a space, which
    # libpq reads as a "+", so ?options=-c a=b failed every connection of the listener.
    params: dict[str, str | int | None] = {
        "host": url.host,
        "port": url.port,
        "user": url.username,
        "password": url.password,
        "dbname": url.database,
    }
    params.update({k: _conninfo_value(k, v) for k, v in url.query.items()})
    params.update({k: str(v) for k, v in postgres_connect_args(database_url).items()})
    return psycopg.conninfo.make_conninfo("", **params)  # None: left out


def _conninfo_value(key: str, value: str | tuple[str, ...]) -> str:
    """A query parameter given several times: options add up; hosts and ports are lists."""
    if isinstance(value, str):
        return value
    return (" " if key == "options" else ",").join(value)
