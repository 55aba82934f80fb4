"""Nodes above the exact tables' GPU count: their answers are kept, not searched again."""

from __future__ import annotations

import pytest

from bench.engine_speed import large_node
from placement import ClusterState, NodeSnapshot, PlacementRequest
from placement.large_node import LargeClass
from placement.node_choice import SetQuery

GPUS = 40


def _large_node(n: int = GPUS) -> NodeSnapshot:
    """n GPUs in NVLink islands of 8, two NUMA nodes (the engine benchmark's large node)."""
    return large_node(n, "big")


class _Searches:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        grow = LargeClass._grow

        def counted(tc: LargeClass, *args: object) -> int:
            self.count += 1
            return grow(tc, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(LargeClass, "_grow", counted)


def test_a_large_node_answers_the_same_question_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every /score of a 63-GPU node searched its best sets from scratch (62-71 ms a call);
    # the answer is a function of the node's design, its free GPUs and the query shape.
    state = ClusterState()
    state.upsert(_large_node())
    searches = _Searches(monkeypatch)
    first = state.evaluate(PlacementRequest(gpus=4))
    assert searches.count > 0
    searches.count = 0
    assert state.evaluate(PlacementRequest(gpus=4)) == first
    assert searches.count == 0


def test_a_changed_free_set_is_searched_again(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClusterState()
    state.upsert(_large_node())
    before = state.evaluate(PlacementRequest(gpus=4))[0].task
    assert before is not None
    state.allocate("big", before.gpu_uuids)
    searches = _Searches(monkeypatch)
    after = state.evaluate(PlacementRequest(gpus=4))[0].task
    assert searches.count > 0
    assert after is not None and not set(after.gpu_uuids) & set(before.gpu_uuids)


def test_kept_answers_are_bounded() -> None:
    from placement.large_node import LARGE_ANSWERS

    state = ClusterState()
    state.upsert(_large_node())
    tc = state.topology_class("big")
    assert isinstance(tc, LargeClass)
    for free in range(1, 3 * 64):
        tc.best_set(free << 1, SetQuery(k=1))
    assert 0 < tc.kept_answers <= LARGE_ANSWERS
    assert LARGE_ANSWERS <= 4096
