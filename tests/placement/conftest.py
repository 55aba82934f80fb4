from __future__ import annotations

import pytest

from placement import ClusterState
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
