"""Typed results to JSON, for the edges that answer in JSON (REST; the /score bytes).

The results' field names and order are the documented views' (results.py),
so orjson encodes the dataclasses directly, in C, without building a dict
per object first. Times are RFC 3339 with ``Z`` for UTC, as the API always
wrote them (``datetime.isoformat`` with ``+00:00`` shown as ``Z``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import orjson

from service.allocations.results import Allocation, NodeScore, TaskPlan

_OPTIONS = orjson.OPT_UTC_Z


def allocation_json(allocation: Allocation) -> bytes:
    """An AllocationView."""
    return orjson.dumps(allocation, option=_OPTIONS)


def allocation_list_json(allocations: Sequence[Allocation]) -> bytes:
    """An AllocationList."""
    return orjson.dumps({"allocations": allocations}, option=_OPTIONS)


def time_text(value: datetime) -> str:
    """A time as the API writes it (for messages that name one)."""
    return orjson.dumps(value, option=_OPTIONS).decode()[1:-1]


def node_score_json(row: NodeScore) -> bytes:
    """A NodeScoreView."""
    return orjson.dumps(row, option=_OPTIONS)


RANK_MARK = 987_654_321  # stands for the rank while a fitting row is encoded once
_MARK = b'"rank":%d' % RANK_MARK


def fit_row_parts(node: str, score: float, plan: TaskPlan) -> tuple[bytes, bytes]:
    """A fitting node's NodeScoreView encoded around its rank, the only part that moves
    while the node is unchanged: (the JSON up to the rank's value, the JSON after it)."""
    encoded = node_score_json(
        NodeScore(node, True, RANK_MARK, score, None, plan.reason, True, plan)
    )
    # Split where the key is: a quote inside a JSON string is escaped, so this text
    # cannot come from the node's name, the only field before it.
    before, after = encoded.split(_MARK, 1)
    return before + b'"rank":', after


def refused_row_tail(cause: str, message: str, resolvable: bool) -> bytes:
    """A refused node's NodeScoreView after its name: the same for every node refused
    for one cause, so it is encoded once per call and cause."""
    row = node_score_json(NodeScore("", False, None, 0.0, cause, message, resolvable, None))
    return row[len(b'{"node":""') :]
