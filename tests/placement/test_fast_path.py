"""The /place hot path agrees with the full path on every decision."""

from __future__ import annotations

import random

import pytest

from placement import ClusterState, PlacementRequest
from placement.profiles import build_profile, gb200_nvl72_rack

PROFILES = ("dgx1-v100", "hgx-h100", "pcie-8x-l40s", "dgx-a100", "riscv-nvlfusion-4", "dgx2-v100")


def _cluster(seed: int) -> ClusterState:
    rng = random.Random(seed)
    state = ClusterState()
    for i in range(30):
        profile = rng.choice(PROFILES)
        labels = {"pool": rng.choice(["a", "b"])}
        state.upsert(
            build_profile(profile, f"n{i:02d}", region=rng.choice(["r1", "r2"]), labels=labels)
        )
    for snap in gb200_nvl72_rack("rack", clique_id=3)[:6]:
        state.upsert(snap)
    return state


def _candidates(rng: random.Random, state: ClusterState) -> tuple[str, ...] | None:
    """None (every node), or a list as schedulers send them: unordered, with a
    duplicate and a name the cluster does not know."""
    if rng.random() < 0.5:
        return None
    names = rng.sample(state.names(), rng.randint(1, 12))
    return (*names, names[0], "not-a-node")


def _requests(rng: random.Random, state: ClusterState) -> PlacementRequest:
    return PlacementRequest(
        gpus=rng.choice([1, 1, 2, 3, 4, 8]),
        locality=rng.choice(["prefer", "any", "nvlink"]),
        policy=rng.choice(["pack", "spread"]),
        objective=rng.choice(["performance", "balanced"]),
        numa=rng.choice(["preferred", "required"]),
        regions=rng.choice([(), ("r1",)]),
        node_labels=rng.choice([{}, {"pool": "b"}]),
        gpu_models=rng.choice([(), ("H100",), ("V100",)]),
        nodes=_candidates(rng, state),
        exclude_nodes=rng.choice([(), (rng.choice(state.names()),)]),
    )


@pytest.mark.parametrize("seed", range(6))
def test_fast_path_matches_full_ranking(seed: int) -> None:
    rng = random.Random(seed)
    state = _cluster(seed)
    held = []
    for _ in range(120):
        request = _requests(rng, state)
        outcome = state.place(request)
        # The full path: rank the candidates with the same keys (evaluate), take the first.
        candidates = request.nodes or tuple(state.names())
        ranked = [
            v for v in state.evaluate(request.model_copy(update={"nodes": candidates})) if v.fits
        ]
        if outcome.placement is None:
            assert not ranked, outcome.summary()
            continue
        task = outcome.placement.tasks[0]
        assert ranked and ranked[0].task is not None
        assert (ranked[0].node, ranked[0].task.gpu_indices) == (task.node, task.gpu_indices)
        assert ranked[0].task.score == task.score
        state.apply(outcome.placement)
        held.append(outcome.placement)
        if len(held) > 12 or rng.random() < 0.2:
            state.unapply(held.pop(rng.randrange(len(held))))
        if rng.random() < 0.05:
            name = rng.choice(state.names())
            state.set_available(name, not state.node(name).available)
