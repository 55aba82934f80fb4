"""A snapshot's design worked out apart from the state (``ClusterState.prepare``)."""

from __future__ import annotations

import pytest

from placement import ClusterState, PlacementRequest, class_registry
from placement.profiles import build_profile


def _count_builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    builds: list[int] = []
    build = class_registry.build_class

    def counted(*args: object, **kwargs: object) -> object:
        builds.append(1)
        return build(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(class_registry, "build_class", counted)
    return builds


def test_prepare_builds_a_new_design_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClusterState()
    state.upsert(build_profile("hgx-h100", "h0"))
    snap = build_profile("dgx1-v100", "v0")
    builds = _count_builds(monkeypatch)
    design = state.prepare(snap)
    assert len(builds) == 1 and design.built is not None
    assert state.class_count == 1 and "v0" not in state and state.has_design(design)
    state.upsert(snap, design)
    assert len(builds) == 1 and state.class_count == 2
    outcome = state.place(PlacementRequest(gpus=4, nodes=["v0"]))
    assert outcome.placement is not None


def test_a_known_design_is_not_built_again(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "v0"))
    builds = _count_builds(monkeypatch)
    design = state.prepare(build_profile("dgx1-v100", "v1"))
    assert design.built is None and builds == []


def test_a_design_prepared_for_another_snapshot_is_not_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = ClusterState()
    design = state.prepare(build_profile("dgx1-v100", "v0"))
    builds = _count_builds(monkeypatch)
    state.upsert(build_profile("hgx-h100", "h0"), design)
    assert len(builds) == 1  # the H100's own design, built by the upsert
    assert state.topology_class("h0").n == 8 and state.class_count == 1
