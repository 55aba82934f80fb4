"""The newest List taken per node and resource, advanced by one transaction at a time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from service import migrate
from service.db import make_engine
from service.k8s import report_order
from service.k8s.device_schemas import DeviceReport

NODE = "h100-a"
NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


@pytest.fixture
def engine(database_url: str) -> Iterator[sa.Engine]:
    migrate.upgrade(database_url)
    engine = make_engine(database_url)
    yield engine
    engine.dispose()


def _body(listed_at: datetime | None) -> DeviceReport:
    return DeviceReport(resource="nvidia.com/gpu", pods=[], listed_at=listed_at)


def _take(engine: sa.Engine, order: report_order.Order) -> None:
    advance = report_order.advance(order)
    assert advance is not None
    with engine.begin() as conn:
        advance(conn)


def test_a_second_advance_from_the_same_read_takes_nothing_under_any_interleaving(
    engine: sa.Engine,
) -> None:
    """Two replicas read the order, then each takes its report: the one whose statement
    comes second, even while the first's transaction is still open (it waits for its
    commit), finds the row moved and takes nothing."""
    _take(engine, report_order.read(engine, NODE, "nvidia.com/gpu", _body(NOW)))
    newer = report_order.read(engine, NODE, "nvidia.com/gpu", _body(NOW + timedelta(seconds=20)))
    older = report_order.read(engine, NODE, "nvidia.com/gpu", _body(NOW + timedelta(seconds=10)))
    first, second = report_order.advance(newer), report_order.advance(older)
    assert first is not None and second is not None
    refused: list[BaseException] = []

    def behind() -> None:
        try:
            with engine.begin() as conn:
                second(conn)
        except report_order.OrderMoved as exc:
            refused.append(exc)

    with engine.begin() as conn:
        first(conn)
        thread = threading.Thread(target=behind)
        thread.start()  # its statement waits for this transaction, or comes after it
    thread.join()
    assert len(refused) == 1
    again = report_order.read(engine, NODE, "nvidia.com/gpu", _body(NOW + timedelta(seconds=10)))
    assert again.newest == NOW + timedelta(seconds=20)
    assert report_order.stale(again, _body(NOW + timedelta(seconds=10))) is not None


def test_two_first_reports_of_a_node_insert_its_row_once(engine: sa.Engine) -> None:
    one = report_order.read(engine, NODE, "nvidia.com/gpu", _body(NOW))
    two = report_order.read(engine, NODE, "nvidia.com/gpu", _body(NOW + timedelta(seconds=1)))
    assert one.newest is None and two.newest is None
    _take(engine, one)
    with pytest.raises(report_order.OrderMoved):
        _take(engine, two)


def test_a_report_without_its_lists_time_reads_and_writes_no_order(engine: sa.Engine) -> None:
    order = report_order.read(engine, NODE, "nvidia.com/gpu", _body(None))
    assert report_order.advance(order) is None
    assert report_order.stale(order, _body(None)) is None
