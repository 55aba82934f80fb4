"""Which List each node's device reports were last taken from, so an older one is not taken after.

The plugin reports each round's List and moves on when a report times out, while the
service may still be working on it: the next round's report can be taken first, on
this replica or another. The kubelet hands a finished pod's devices to the next pod
before the API shows the first one finished, so the older List names the first pod on
devices the newer one gave the next; taken last, it moved them back onto the pod that
no longer runs. A report whose List (``listed_at``) was read before the last one taken
for its node and resource, by less than ``REORDER_S``, is answered with nothing
changed: the plugin's next round reads the List again. One older by more is the
node's clock stepped back (no report is held up that long), and is taken: were it
refused, the node's truth would wait until its clock caught up. A report without
``listed_at`` (an older plugin) is taken, and moves the order nowhere.

The newest List taken is the database's (``k8s_report_order``, service/schema.py), so
every replica judges by it. It is read before the report reads anything else
(``read``), and the transaction that takes the report first advances it from what was
read, in one conditional statement (``advance``): when another report of the node and
resource was taken meanwhile, on any replica, that statement changes no row and the
report is read again (``OrderMoved``), older now or planned on what the other wrote.
On Postgres the statement waits for a transaction that wrote the row to end and then
finds the row it left; on SQLite it is the transaction's first write, and takes the
database's one write lock before the transaction reads anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from service import schema
from service.k8s.device_schemas import DeviceReport, PodOutcome

# Past the plugin's client timeout (5 s) and a round (10 s) or two: how much older than
# the last List taken a report's may be and still be one answered late.
REORDER_S = 30.0
_T = schema.k8s_report_order


class OrderMoved(Exception):
    """Another report of the node and resource was taken after this one read the order:
    the report is read again."""


class NodeLocks:
    """One lock per node this replica takes reports of: its reports are read and taken in
    turn here, so two of them do not both read the order and one read again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, threading.Lock] = {}

    def node_lock(self, node: str) -> threading.Lock:
        with self._lock:
            return self._nodes.setdefault(node, threading.Lock())


@dataclass(frozen=True)
class Order:
    """A report's place in its node's order, as read before the report was."""

    node: str
    resource: str
    listed_at: datetime | None  # the report's List, in UTC (None: not said)
    newest: datetime | None  # the newest List taken, in UTC (None: none yet)


def read(engine: Engine, node: str, resource: str, body: DeviceReport) -> Order:
    """The report's place among the node's reports of ``resource`` (the report's, or the
    name its kind of device is kept under): read first, before anything the report is
    judged on."""
    listed_at = body.listed_at.astimezone(UTC) if body.listed_at is not None else None
    newest = None
    if listed_at is not None:
        query = sa.select(_T.c.listed_at).where(_T.c.node == node, _T.c.resource == resource)
        with engine.connect() as conn:
            found = conn.execute(query).scalar_one_or_none()
        newest = _aware(found) if found is not None else None
    return Order(node, resource, listed_at, newest)


def stale(order: Order, body: DeviceReport) -> list[PodOutcome] | None:
    """Each pod deferred when the report's List is older than the newest taken for its
    node and resource, by less than REORDER_S; None when it is to be taken."""
    newest, listed_at = order.newest, order.listed_at
    if listed_at is None or newest is None or listed_at >= newest:
        return None
    if listed_at < newest - timedelta(seconds=REORDER_S):
        return None  # the node's clock stepped back
    message = (
        f"the report's List was read at {listed_at.isoformat()}, before that of a"
        f" newer report taken already ({newest.isoformat()}): nothing is changed by it"
    )
    return _deferred(body, message)


def moved_meanwhile(body: DeviceReport) -> list[PodOutcome]:
    """Each pod deferred: other reports of the node were taken each time this one was
    read again (the plugin's next round reports again)."""
    message = (
        "other reports of the node were taken while this one was read, each time it was"
        " read again: nothing is changed by it"
    )
    return _deferred(body, message)


def advance(order: Order) -> Callable[[Connection], None] | None:
    """The report's first statement in the transaction that takes it: the newest List
    taken becomes the report's, if it is still the one read (else ``OrderMoved``, and
    the transaction takes nothing). None for a report that does not say its List's time."""
    if order.listed_at is None:
        return None
    listed_at = order.listed_at

    def check(conn: Connection) -> None:
        key = {"node": order.node, "resource": order.resource}
        if order.newest is None:
            dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
            statement: sa.Insert | sa.Update = (
                dialect.insert(_T).values(**key, listed_at=listed_at).on_conflict_do_nothing()
            )
        else:
            statement = (
                sa.update(_T)
                .where(
                    _T.c.node == order.node,
                    _T.c.resource == order.resource,
                    _T.c.listed_at == order.newest,
                )
                .values(listed_at=listed_at)
            )
        # RETURNING, not the row count: an INSERT ... ON CONFLICT read -1 rows through psycopg.
        if conn.execute(statement.returning(_T.c.node)).first() is None:
            raise OrderMoved(f"a report of {order.node} ({order.resource}) was taken meanwhile")

    return check


def _deferred(body: DeviceReport, message: str) -> list[PodOutcome]:
    return [
        PodOutcome(namespace=p.namespace, name=p.name, action="deferred", message=message)
        for p in body.pods
    ]


def _aware(value: datetime) -> datetime:
    """SQLite hands back times without their zone; they are stored in UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
