"""The workload mix file's text: read strictly, written to read back, and what it changes."""

from __future__ import annotations

import json

import pytest

from placement import ClusterState, PlacementRequest
from placement.model_demand import MAX_LISTS
from placement.profiles import build_profile
from placement.task_mix import MAX_TYPES
from placement.what_is_left import DEFAULT_SIZE_MIX
from placement.workload_mix import MAX_WEIGHT, WorkloadMix, WorkloadMixError, parse, to_text
from tests.placement.conftest import place_applied as place
from tests.placement.conftest import uuids

FULL_MIX = WorkloadMix(
    size_mix={8: 44.0, 1: 3911.0, 2: 16.0},
    host_mix=(6000.5, 24576.0),
    task_mix={(1, 470, 3152, 8192): 20.0, (8, 1000, 88000, 327680): 1.0},
    model_demand={("T4",): 160.0, (): 6000.0, ("V100", "P100"): 24.5},
)


def test_every_part_reads_back_as_written_in_the_same_order() -> None:
    back = parse(to_text(FULL_MIX))
    assert back == FULL_MIX
    # The engine sums the weights in the order given: the order is part of the mix.
    for part in ("size_mix", "task_mix", "model_demand"):
        assert list(getattr(back, part).items()) == list(getattr(FULL_MIX, part).items())


def test_every_part_is_optional() -> None:
    assert parse('{"version": 1}') == WorkloadMix()
    only = parse('{"version": 1, "model_demand": [{"models": ["T4"], "gpus": 2}]}')
    assert only == WorkloadMix(model_demand={("T4",): 2.0})
    assert parse(to_text(only)) == only


def test_a_state_keeps_the_mix_it_was_built_with() -> None:
    state = ClusterState.from_mix(FULL_MIX)
    assert state.mix == FULL_MIX
    assert state._table.task_mix.configured and state._table.model_demand.configured
    default = ClusterState.from_mix(WorkloadMix())
    assert default.mix == WorkloadMix(size_mix=DEFAULT_SIZE_MIX) == ClusterState().mix
    assert not default._table.task_mix.configured  # left out: observed
    assert ClusterState.from_mix(default.mix).mix == default.mix


def _with(**parts: object) -> str:
    return json.dumps({"version": 1, **parts})


TYPE = {"gpus": 1, "gpu_milli": 1000, "cpu_milli": 0, "memory_mib": 0, "weight": 1}


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("", "not JSON"),
        ("[]", "the file: an object"),
        ("{}", "version: missing"),
        ('{"version": 2}', "version: 2 is not 1"),
        ('{"version": true}', "version: True is not 1"),
        ('{"version": 1, "version": 1}', "'version' appears twice"),
        (_with(sizes={}), "unknown key 'sizes'"),
        (_with(size_mix={"0": 1}), "size_mix['0']"),
        (_with(size_mix={"65": 1}), "size_mix['65']"),
        (_with(size_mix={"+1": 1}), "size_mix['+1']"),
        (_with(size_mix={"1": 0}), "size_mix: every weight is 0"),
        (_with(size_mix={"1": -1}), "size_mix['1']: -1 is not within"),
        (_with(size_mix={"1": "3"}), "size_mix['1']: a number"),
        (_with(size_mix={"1": True}), "size_mix['1']: a number"),
        (_with(size_mix={"1": 1e16}), "size_mix['1']"),
        ('{"version": 1, "size_mix": {"1": NaN}}', "NaN is not a number"),
        ('{"version": 1, "size_mix": {"1": 1e999}}', "size_mix['1']: inf"),
        (_with(size_mix={}), "size_mix: empty"),
        (_with(host_mix={"cpu_milli_per_gpu": 1}), "host_mix.memory_mib_per_gpu: missing"),
        (_with(host_mix=[1, 2]), "host_mix: an object"),
        (_with(task_mix=[]), "task_mix: empty"),
        (_with(task_mix=[{**TYPE, "gpus": 0}]), "task_mix[0].gpus: 0 is not within 1..64"),
        (_with(task_mix=[{**TYPE, "gpus": 1.0}]), "task_mix[0].gpus: a whole number"),
        (_with(task_mix=[{**TYPE, "gpus": 2, "gpu_milli": 500}]), "task_mix[0].gpu_milli"),
        (_with(task_mix=[{**TYPE, "gpu_milli": 1001}]), "task_mix[0].gpu_milli"),
        (_with(task_mix=[{**TYPE, "cpu_milli": -1}]), "task_mix[0].cpu_milli"),
        (_with(task_mix=[{**TYPE, "weight": 0}]), "task_mix[0].weight: 0 is not more than 0"),
        (_with(task_mix=[{"gpus": 1}]), "task_mix[0].gpu_milli: missing"),
        (_with(task_mix=[TYPE, TYPE]), "task_mix[1]: the same type as task_mix[0]"),
        (_with(task_mix=[TYPE] * (MAX_TYPES + 1)), f"task_mix: {MAX_TYPES + 1} entries"),
        (_with(model_demand=[{"models": "T4", "gpus": 1}]), "model_demand[0].models: a list"),
        (_with(model_demand=[{"models": [" T4"], "gpus": 1}]), "model_demand[0].models[0]"),
        (_with(model_demand=[{"models": [""], "gpus": 1}]), "model_demand[0].models[0]"),
        (_with(model_demand=[{"models": ["x" * 129], "gpus": 1}]), "model_demand[0].models[0]"),
        (_with(model_demand=[{"models": ["T\u0000"], "gpus": 1}]), "model_demand[0].models[0]"),
        (_with(model_demand=[{"models": ["T4"] * 65, "gpus": 1}]), "65 models, at most 64"),
        (
            _with(model_demand=[{"models": ["t4"], "gpus": 1}, {"models": ["T4"], "gpus": 1}]),
            "model_demand[1].models: the same list as model_demand[0]",
        ),
        (_with(model_demand=[{"models": [], "gpus": 0}]), "every entry's gpus is 0"),
        (_with(model_demand=[{"models": []}]), "model_demand[0].gpus: missing"),
        (
            _with(model_demand=[{"models": [f"M{i}"], "gpus": 1} for i in range(MAX_LISTS + 1)]),
            f"at most {MAX_LISTS} model lists",
        ),
        (
            _with(model_demand=[{"models": [], "gpus": 1}] * (MAX_LISTS + 2)),
            f"{MAX_LISTS + 2} entries, at most {MAX_LISTS + 1}",
        ),
    ],
)
def test_a_bad_file_is_refused_in_one_line_naming_the_field(text: str, named: str) -> None:
    with pytest.raises(WorkloadMixError) as caught:
        parse(text)
    message = str(caught.value)
    assert named in message and "\n" not in message


def test_the_limits_themselves_are_taken() -> None:
    lists = [{"models": [f"M{i}"], "gpus": MAX_WEIGHT} for i in range(MAX_LISTS)]
    types = [{**TYPE, "cpu_milli": i} for i in range(MAX_TYPES)]
    mix = parse(_with(model_demand=[{"models": [], "gpus": 1}, *lists], task_mix=types))
    assert mix.model_demand is not None and len(mix.model_demand) == MAX_LISTS + 1
    assert mix.task_mix is not None and len(mix.task_mix) == MAX_TYPES
    ClusterState.from_mix(mix)  # and the engine takes them


def test_a_mix_that_would_not_read_back_is_not_written() -> None:
    with pytest.raises(WorkloadMixError, match="size_mix"):
        to_text(WorkloadMix(size_mix={128: 1.0}))
    with pytest.raises(WorkloadMixError, match="not a finite number"):
        to_text(WorkloadMix(host_mix=(float("nan"), 1.0)))


def test_a_configured_model_demand_ranks_from_the_first_decision() -> None:
    """Observed, a fresh state has seen no request naming a model and packs onto the
    V100 box; configured with V100s in demand, a request that runs anywhere leaves them."""
    demand = parse(
        _with(model_demand=[{"models": [], "gpus": 100}, {"models": ["V100"], "gpus": 50}])
    )
    chosen = {}
    for label, mix in (("observed", WorkloadMix()), ("configured", demand)):
        state = ClusterState.from_mix(mix)
        state.upsert(build_profile("dgx1-v100", "v100"))
        state.upsert(build_profile("pcie-8x-l40s", "l40s"))
        state.allocate("v100", uuids(state, "v100", [0, 1, 2, 3, 4, 5]))
        chosen[label] = place(state, PlacementRequest())[0]
    assert chosen == {"observed": "v100", "configured": "l40s"}


def test_states_given_the_same_file_rank_alike_whatever_each_has_served() -> None:
    """Two replicas: one has served requests naming V100s, the other none. Observed,
    they rank a request that runs anywhere differently; configured by one file, alike."""
    text = _with(model_demand=[{"models": [], "gpus": 100}, {"models": ["V100"], "gpus": 10}])
    chosen: dict[str, list[str]] = {}
    for label, mix in (("observed", WorkloadMix()), ("configured", parse(text))):
        for served in (0, 3):
            state = ClusterState.from_mix(mix)
            state.upsert(build_profile("dgx1-v100", "v100"))
            state.upsert(build_profile("pcie-8x-l40s", "l40s"))
            state.allocate("v100", uuids(state, "v100", [0, 1, 2, 3]))
            for _ in range(served):
                state.place(PlacementRequest(gpu_models=("V100",)))  # decided, not applied
            chosen.setdefault(label, []).append(place(state, PlacementRequest())[0])
    assert chosen["observed"] == ["v100", "l40s"]
    assert chosen["configured"][0] == chosen["configured"][1]
