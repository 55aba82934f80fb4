from __future__ import annotations

import pytest

from placement import ClusterState, PlacementRequest
from placement.profiles import build_profile


@pytest.fixture
def dgx1_cluster() -> ClusterState:
    state = ClusterState()
    for i in range(3):
        state.upsert(build_profile("dgx1-v100", f"dgx{i}"))
    return state


def uuids(state: ClusterState, node: str, indices: list[int]) -> list[str]:
    snap = state.node(node).snapshot
    return [snap.gpus[i].uuid for i in indices]


def dgx1_nodes(*names: str, host_mix: tuple[float, float] | None = None) -> ClusterState:
    """A cluster of DGX-1 V100 nodes with these names."""
    state = ClusterState(host_mix=host_mix)
    for name in names:
        state.upsert(build_profile("dgx1-v100", name))
    return state


def place_applied(state: ClusterState, request: PlacementRequest) -> tuple[str, tuple[int, ...]]:
    """Place a one-task request, apply it, and say where its task went."""
    outcome = state.place(request)
    assert outcome.placement is not None, outcome.summary()
    state.apply(outcome.placement)
    task = outcome.placement.tasks[0]
    return task.node, task.gpu_indices
