"""Model pressure: requests that can run anywhere leave the models others insist on."""

from __future__ import annotations

import numpy as np
import pytest

from placement import ClusterState, PlacementRequest
from placement.eligibility import model_pressure
from placement.model_demand import (
    MAX_LISTS,
    PRESSURE_CAP,
    ListColumns,
    ModelDemand,
    model_list,
    pressure,
)
from placement.profiles import build_profile
from tests.placement.conftest import place_applied as place
from tests.placement.conftest import uuids


def two_models() -> ClusterState:
    """One DGX-1 (V100) with 6 of its 8 GPUs held, one 8x L40S box all free."""
    state = ClusterState()
    state.upsert(build_profile("dgx1-v100", "v100"))
    state.upsert(build_profile("pcie-8x-l40s", "l40s"))
    state.allocate("v100", uuids(state, "v100", [0, 1, 2, 3, 4, 5]))
    return state


def test_without_a_request_naming_a_model_packing_decides_as_before() -> None:
    state = two_models()
    assert place(state, PlacementRequest())[0] == "v100"  # packed beside the 6 held
    assert model_pressure(state._table) is None


def test_a_request_that_can_run_anywhere_leaves_the_model_others_insist_on() -> None:
    state = two_models()
    state.release("v100", uuids(state, "v100", [4, 5]))  # 4 free V100s
    for _ in range(2):  # the demand seen: V100s asked for by name
        assert place(state, PlacementRequest(gpu_models=("v100",)))[0] == "v100"
    # The V100 box has 2 free, as in the test above, but V100s are pressed now.
    assert place(state, PlacementRequest())[0] == "l40s"
    # What insists on V100 still gets it: pressure only orders what may go anywhere.
    assert place(state, PlacementRequest(gpu_models=("V100",)))[0] == "v100"


def test_every_path_ranks_by_pressure_alike() -> None:
    state = two_models()
    state.place(PlacementRequest(gpu_models=("V100",)))  # decided, not applied: still seen
    for request in (PlacementRequest(cpu_milli=1000), PlacementRequest()):  # full, hot path
        placed = state.place(request).placement
        assert placed is not None and placed.tasks[0].node == "l40s"
    assert state.evaluate(PlacementRequest())[0].node == "l40s"
    gang = state.place(PlacementRequest(tasks=2))
    assert gang.placement is not None
    assert {t.node for t in gang.placement.tasks} == {"l40s"}


def columns(asked: list[float], matched: list[list[int]], gpu_count: list[int]) -> ListColumns:
    share = np.asarray(matched, dtype=np.float64) / np.maximum(np.asarray(gpu_count), 1)
    return ListColumns(
        asked=np.asarray(asked, dtype=np.float64),
        masks=np.zeros(share.shape, dtype=np.int64),  # read by the caller, not here
        share=share,
    )


def test_pressure_is_the_demand_share_against_the_free_share() -> None:
    # 10 GPUs free: 8 on a node without T4, 2 on a T4 node.
    t4 = columns([2.0], [[0, 2, 0]], [8, 2, 0])
    # A fifth of the demand insists on T4, a fifth of the free GPUs are T4s.
    values = pressure(10.0, t4, np.array([2.0]), 10.0)
    assert values.tolist() == pytest.approx([0.0, 1.0, 0.0])
    # Half as many T4s free: twice as pressed, whatever the fleet's share of T4s.
    assert pressure(10.0, t4, np.array([1.0]), 10.0).tolist() == pytest.approx([0, 2.0, 0])
    half = columns([2.0], [[0, 1, 0]], [8, 2, 0])  # T4 is half of the node's GPUs
    assert pressure(10.0, half, np.array([1.0]), 10.0).tolist() == pytest.approx([0, 1.0, 0])
    nobody = columns([2.0], [[0, 0, 0]], [8, 2, 0])
    assert pressure(10.0, nobody, np.array([0.0]), 10.0).tolist() == [0.0, 0.0, 0.0]
    # Every T4 taken: the list is pressed to the cap, as is a flood of demand.
    assert pressure(10.0, t4, np.array([0.0]), 10.0).max() == PRESSURE_CAP
    assert (
        pressure(1000.0, columns([1000.0], [[0, 2, 0]], [8, 2, 0]), np.array([1.0]), 10.0).max()
        == PRESSURE_CAP
    )


def test_a_model_few_insist_on_is_pressed_once_the_rest_took_most_of_it() -> None:
    # V100s are half of the fleet and a sixteenth of the demand insists on them: against
    # the fleet that is no pressure, so packing used to give the last free V100s to
    # requests that run anywhere, and the next V100-only request found none.
    state = two_models()
    state.allocate("v100", uuids(state, "v100", [6]))  # 1 V100 free, 8 L40S
    for _ in range(15):  # the demand seen: 15 GPUs asked without a model...
        state._table.model_demand.observe((), 1.0)
    state.place(PlacementRequest(gpu_models=("V100",)))  # ...then 1 of V100 (not applied)
    # A sixteenth of the demand against a ninth of the free GPUs: pressed.
    assert place(state, PlacementRequest())[0] == "l40s"
    assert place(state, PlacementRequest(gpu_models=("V100",)))[0] == "v100"


def test_a_configured_demand_presses_before_any_request_names_a_model() -> None:
    state = ClusterState(model_demand={(): 15.0, ("v100",): 1.0})
    state.upsert(build_profile("dgx1-v100", "v100"))
    state.upsert(build_profile("pcie-8x-l40s", "l40s"))
    state.allocate("v100", uuids(state, "v100", [0, 1, 2, 3, 4, 5, 6]))
    assert place(state, PlacementRequest())[0] == "l40s"
    # Configured, it is the mix: decisions do not change it.
    state.place(PlacementRequest(gpu_models=("L40S",)))
    assert state._table.model_demand.by_list == {("V100",): 1.0}
    assert state._table.model_demand.total == 16.0
    with pytest.raises(ValueError, match="GPUs asked"):
        ClusterState(model_demand={("T4",): -1.0})
    with pytest.raises(ValueError, match="model lists"):
        ClusterState(model_demand={(f"m{i}",): 1.0 for i in range(MAX_LISTS + 1)})


def test_model_names_no_gpu_matches_cost_nothing() -> None:
    state = two_models()
    state.place(PlacementRequest(gpu_models=("V100",)))
    for i in range(MAX_LISTS - 1):  # invented names: kept in the demand, matching no GPU
        state.place(PlacementRequest(gpu_models=(f"junk{i}",)))
    assert len(state._table.model_demand.by_list) == MAX_LISTS
    assert model_pressure(state._table) is not None
    lists = state._table.pressure_lists
    assert lists is not None and lists[1].masks.shape[0] == 1  # V100's alone is read


def test_model_lists_are_one_key_however_spelled_and_bounded() -> None:
    assert model_list(["v100", "A100", "V100"]) == ("A100", "V100")
    demand = ModelDemand()
    demand.observe(("T4",), 50.0)
    for i in range(3 * MAX_LISTS):  # a caller inventing model names
        demand.observe((f"junk{i}",), 1.0)
    assert len(demand.by_list) == MAX_LISTS
    assert demand.by_list[("T4",)] == 50.0  # asked more than any junk: kept
    assert demand.total == 50.0 + 3 * MAX_LISTS
