"""The per-node filters (placement/eligibility.py): remembered, but not without end."""

from __future__ import annotations

from placement import ClusterState, PlacementRequest
from placement.eligibility import gpu_eligible, labels_ok, region_ok
from placement.profiles import build_profile
from placement.table import NodeTable


def _table() -> NodeTable:
    state = ClusterState()
    for i in range(3):
        state.upsert(build_profile("dgx1-v100", f"dgx{i}"))
    table: NodeTable = state._table
    return table


def test_a_caller_naming_new_filters_each_time_does_not_grow_the_memory() -> None:
    """Each filter was kept until the fleet changed: a steady fleet kept one array per node
    slot for every distinct model list, region list and label selector ever asked, so a
    caller varying them grew the process without end."""
    table = _table()
    for i in range(1000):
        region_ok(table, (f"r{i}",))
        labels_ok(table, {"team": f"t{i}"})
        gpu_eligible(table, PlacementRequest(gpu_models=(f"m{i}",)))
    assert len(table.static_cache) <= 256  # a few hundred arrays at most, whatever is asked


def test_a_filter_asked_again_is_the_one_remembered() -> None:
    table = _table()
    first = region_ok(table, ("default",))
    assert region_ok(table, ("default",)) is not None and first.all()
    assert len(table.static_cache) == 1
    models = gpu_eligible(table, PlacementRequest(gpu_models=("V100",)))
    assert (models == 0xFF).all()
    assert not gpu_eligible(table, PlacementRequest(gpu_models=("A100",))).any()
