"""What a truth's hold names of its node's row."""

from __future__ import annotations

from datetime import UTC, datetime

from service.allocations.mapped_on import MappedOn


def test_a_hold_names_the_cordon_as_memory_had_it() -> None:
    at = datetime(2026, 12, 6, tzinfo=UTC)
    assert MappedOn(7, at, True).columns() == {
        "node_seq": 7,
        "node_reported_at": at,
        "node_cordoned": True,
    }
    assert MappedOn(7, at, False).columns()["node_cordoned"] is False


def test_without_a_reported_at_only_the_seq_is_named() -> None:
    """The row's key then checks nothing (a NULL column), rather than half of it."""
    assert MappedOn(7, None, True).columns() == {
        "node_seq": 7,
        "node_reported_at": None,
        "node_cordoned": None,
    }
