"""Model pressure: requests that can run anywhere leave the models others insist on."""

from __future__ import annotations

import numpy as np
import pytest

from placement import ClusterState, PlacementRequest
from placement.eligibility import model_pressure
from placement.model_demand import MAX_LISTS, PRESSURE_CAP, ModelDemand, model_list, pressure
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


def test_pressure_is_the_demand_share_against_the_fleet_share() -> None:
    demand = ModelDemand()
    demand.observe((), 8.0)  # asked without a model
    demand.observe(("t4",), 2.0)  # a fifth of the demand insists on T4...
    gpu_count = np.array([8, 2, 0])
    t4 = np.array([0, 2, 0])  # ...which is a fifth of the fleet's 10 GPUs
    values = pressure(demand, [(2.0, t4)], gpu_count)
    assert values.tolist() == pytest.approx([0.0, 1.0, 0.0])
    scarce = pressure(demand, [(2.0, np.array([0, 1, 0]))], gpu_count)  # a tenth: 2x
    assert scarce.tolist() == pytest.approx([0.0, 1.0, 0.0])  # half of the node's GPUs
    nobody = pressure(demand, [(2.0, np.zeros(3, dtype=np.int64))], gpu_count)
    assert nobody.tolist() == [0.0, 0.0, 0.0]  # a list no GPU matches presses nothing
    flood = ModelDemand()
    flood.observe(("t4",), 1000.0)
    assert pressure(flood, [(1000.0, np.array([0, 1, 0]))], gpu_count).max() == PRESSURE_CAP


def test_model_lists_are_one_key_however_spelled_and_bounded() -> None:
    assert model_list(["v100", "A100", "V100"]) == ("A100", "V100")
    demand = ModelDemand()
    demand.observe(("T4",), 50.0)
    for i in range(3 * MAX_LISTS):  # a caller inventing model names
        demand.observe((f"junk{i}",), 1.0)
    assert len(demand.by_list) == MAX_LISTS
    assert demand.by_list[("T4",)] == 50.0  # asked more than any junk: kept
    assert demand.total == 50.0 + 3 * MAX_LISTS
