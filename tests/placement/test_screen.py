"""The array screen agrees with the per-node verdicts it stands in for."""

from __future__ import annotations

import numpy as np
import pytest

from placement import ClusterState, PlacementRequest
from placement.profiles import build_profile

PROFILES = ("dgx1-v100", "hgx-h100", "pcie-8x-l40s", "workstation-2x-a6000", "dgx2-v100")


def _cluster() -> ClusterState:
    state = ClusterState()
    for i, profile in enumerate(PROFILES * 3):
        state.upsert(build_profile(profile, f"n{i:02d}-{profile}"))
    # Fragment some nodes so the answers differ from node to node.
    for i, name in enumerate(state.names()):
        gpus = [g.uuid for g in state.node(name).snapshot.gpus]
        state.allocate(name, gpus[i % 3 : i % 3 + (i % 4)])
    state.set_available(state.names()[4], False)
    return state


@pytest.mark.parametrize(
    "body",
    [
        {"gpus": 1},
        {"gpus": 2, "locality": "nvlink"},
        {"gpus": 4, "locality": "nvlink", "policy": "spread"},
        {"gpus": 4, "locality": "prefer", "numa": "required"},
        {"gpus": 8, "objective": "balanced"},
        {"gpus": 3, "gpu_models": ["H100"]},
    ],
)
def test_screen_matches_evaluate(body: dict[str, object]) -> None:
    state = _cluster()
    request = PlacementRequest.model_validate(body)
    screened = state.screen(request)
    verdicts = {v.node: v for v in state.evaluate(request)}
    assert set(screened.names) == set(verdicts)
    for i, name in enumerate(screened.names):
        verdict = verdicts[name]
        assert bool(screened.fits[i]) == verdict.fits, name
        if verdict.fits:
            assert verdict.task is not None
            assert screened.gpu_indices(i) == verdict.task.gpu_indices
            assert int(screened.rank[i]) == verdict.rank
            assert float(screened.score[i]) == pytest.approx(verdict.score)
            assert screened.cause(i) is None and screened.message(i, request) == ""
        else:
            assert screened.cause(i) == verdict.cause
            assert screened.message(i, request) == verdict.message
            assert screened.rank[i] == 0 and screened.gpu_indices(i) == ()


def test_named_nodes_and_unknown_names() -> None:
    state = _cluster()
    wanted = [state.names()[3], "ghost", state.names()[1]]
    screened = state.screen(PlacementRequest(gpus=1, nodes=wanted))
    assert sorted(screened.names) == sorted(wanted[::2])
    assert screened.unknown == ("ghost",)


def test_screen_refuses_gangs_and_mig() -> None:
    state = _cluster()
    with pytest.raises(ValueError, match="evaluate"):
        state.screen(PlacementRequest(gpus=2, tasks=2))


def test_a_repeated_candidate_list_is_remembered_until_membership_changes() -> None:
    state = _cluster()
    names = tuple(reversed(state.names()))
    first = state.screen(PlacementRequest(gpus=1, nodes=names))
    again = state.screen(PlacementRequest(gpus=1, nodes=list(names)))
    assert again.names == first.names
    gone = state.names()[0]
    state.remove(gone)  # the remembered slots would still name it
    after = state.screen(PlacementRequest(gpus=1, nodes=names))
    assert gone not in after.names and after.unknown == (gone,)


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_best_only_ranking_marks_the_full_rankings_first(gpus: int) -> None:
    state = _cluster()
    request = PlacementRequest(gpus=gpus)
    full = state.screen(request)
    best = state.screen(request, full_rank=False)
    assert (best.fits == full.fits).all() and (best.score == full.score).all()
    assert (best.rank == (full.rank == 1)).all()
    assert int((best.rank == 1).sum()) == min(1, int(full.fits.sum()))


def test_names_at_reads_the_names_of_the_moment_it_screened() -> None:
    state = _cluster()
    screened = state.screen(PlacementRequest(gpus=1))
    first = screened.names[0]
    state.remove(first)
    assert screened.names_at(np.zeros(1, dtype=np.int64)) == [first]
    assert screened.names[0] == first


@pytest.mark.parametrize("full_rank", [True, False])
def test_identical_nodes_tie_with_the_best_and_others_do_not(full_rank: bool) -> None:
    cluster = ClusterState()
    for profile, name in [("hgx-h100", "a"), ("hgx-h100", "b"), ("dgx1-v100", "v")]:
        cluster.upsert(build_profile(profile, name))
    request = PlacementRequest(gpus=4, nodes=("v", "b", "a"))
    screen = cluster.screen(request, full_rank=full_rank)
    tied = dict(zip(screen.names, screen.tied_best.tolist(), strict=True))
    best = screen.names[int(np.flatnonzero(screen.rank == 1)[0])]
    assert tied[best]
    assert tied == {"a": True, "b": True, "v": False}
