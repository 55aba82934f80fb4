"""/score: every requested node's verdict, reserving nothing.

Two forms of one answer: typed rows (``score``: gRPC, the Slurm filter) and
the REST body already encoded (``score_json``), which reuses each fitting
node's encoded row while the node is unchanged (score_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import orjson

from placement import Cause, NodeVerdict, TaskPlacement
from placement.explain import cause_message, mig_mode_message
from service.allocations.encoding import node_score_json, refused_row_tail
from service.allocations.results import NodeScore
from service.allocations.schemas import ScoreRequest
from service.state import ServiceState


class _Messages:
    """One message per cause: hundreds of refused nodes share a handful of causes. A node
    refused for GPUs in MIG mode gets its own, saying how many whole GPUs it has."""

    def __init__(self, state: ServiceState, body: ScoreRequest) -> None:
        self.state = state
        self.body = body
        self._of: dict[Cause, str] = {}

    def for_node(self, node: str, cause: Cause) -> str | None:
        """The node's own message, where its cause has one (called under the state lock)."""
        if cause is not Cause.MIG_MODE:
            return None
        snap = self.state.cluster.node(node).snapshot
        return mig_mode_message(self.body, sum(not g.mig_enabled for g in snap.gpus))

    def of(self, cause: Cause) -> str:
        message = self._of.get(cause)
        if message is None:
            message = self._of[cause] = cause_message(cause, self.body)
        return message


def _refused(node: str, cause: Cause, message: str) -> NodeScore:
    return NodeScore(node, False, None, 0.0, cause.value, message, cause.resolvable, None)


def _refused_mig(verdict: NodeVerdict) -> NodeScore:
    return _refused(verdict.node, verdict.cause or Cause.NOT_REGISTERED, verdict.message)


def score(state: ServiceState, body: ScoreRequest) -> list[NodeScore]:
    """Every requested node's verdict (NodeScoreView), typed."""
    messages = _Messages(state, body)
    fit = state.score_cache.fit
    return _score_rows(
        state,
        body,
        lambda node, rank, score, task: fit(rank, score, task),
        lambda node, cause: _refused(
            node, cause, messages.for_node(node, cause) or messages.of(cause)
        ),
        _refused_mig,
    )


def score_json(state: ServiceState, body: ScoreRequest) -> bytes:
    """The same answer as a ScoreResult, encoded. Each fitting node's row is encoded once
    while the node is unchanged and only its rank is written per call, so scoring 500
    nodes pod after pod costs a join instead of 500 nested objects built and encoded."""
    messages = _Messages(state, body)
    refused_tails: dict[Cause, bytes] = {}
    cache = state.score_cache
    remembered = cache.rows.get

    def fit(node: str, rank: int, score: float, task: TaskPlacement) -> bytes:
        # Inline on purpose: this runs once per fitting node per call.
        parts = remembered(id(task))
        if parts is None or parts[0] is not task or parts[1] != score:
            parts = cache.row(task, score)
        return b"%s%d%s" % (parts[2], rank, parts[3])

    def refused(node: str, cause: Cause) -> bytes:
        own = messages.for_node(node, cause)
        if own is not None:
            return (
                b'{"node":'
                + orjson.dumps(node)
                + refused_row_tail(cause.value, own, cause.resolvable)
            )
        tail = refused_tails.get(cause)
        if tail is None:
            tail = refused_tails[cause] = refused_row_tail(
                cause.value, messages.of(cause), cause.resolvable
            )
        return b'{"node":' + orjson.dumps(node) + tail

    rows = _score_rows(state, body, fit, refused, lambda v: node_score_json(_refused_mig(v)))
    return b'{"nodes":[' + b",".join(rows) + b"]}"


Row = TypeVar("Row")


def _score_rows(
    state: ServiceState,
    body: ScoreRequest,
    fit: Callable[[str, int, float, TaskPlacement], Row],
    refused: Callable[[str, Cause], Row],
    refused_mig: Callable[[NodeVerdict], Row],
) -> list[Row]:
    with state.lock:
        state.refresh_if_due()
        if body.mig_profile is None:
            return state.cluster.verdict_rows(body, fit, refused)
        verdicts = state.cluster.evaluate(body)
    return [
        fit(v.node, v.rank or 0, v.score, v.task)
        if v.fits and v.task is not None
        else refused_mig(v)
        for v in verdicts
    ]
