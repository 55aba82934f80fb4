"""The allocations API: one entry point for callers, results named as the wire names them."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
from pydantic import BaseModel

from service.allocations import results, schemas

ROOT = Path(__file__).resolve().parents[3]
# What code outside service/allocations/ may import from it: the API, its vocabulary
# (results, request schemas) and the REST router the application mounts.
PUBLIC = {"api", "results", "schemas", "endpoints"}
# The service state owns the group committer and the /score cache it hands the API.
WIRING = {"service/state.py": {"group_commit", "score_cache"}}


def _imported_modules(path: Path) -> set[str]:
    """The service.allocations submodules a file imports, however it spells it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "service.allocations":
                found |= {alias.name for alias in node.names}
            elif node.module.startswith("service.allocations."):
                found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("service.allocations."):
                    found.add(alias.name.split(".")[2])
    return found


def test_callers_reach_allocations_only_through_the_api() -> None:
    offenders = []
    for package in ("service", "agent", "topoplace", "bench"):
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            if relative.startswith("service/allocations/"):
                continue
            allowed = PUBLIC | WIRING.get(relative, set())
            wrong = _imported_modules(path) - allowed
            if wrong:
                offenders.append(f"{relative}: {sorted(wrong)}")
    assert offenders == [], "call service.allocations.api instead"


def test_the_boundary_check_sees_every_spelling(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from service.allocations import lifecycle, api\n"
        "from service.allocations.repository import by_id\n"
        "import service.allocations.place_flow\n"
    )
    assert _imported_modules(sample) == {"lifecycle", "api", "repository", "place_flow"}


@pytest.mark.parametrize(
    ("typed", "view"),
    [
        (results.Allocation, schemas.AllocationView),
        (results.Task, schemas.TaskView),
        (results.TaskPlan, schemas.ScoreTaskView),
        (results.TaskScore, schemas.ScoreView),
        (results.NodeScore, schemas.NodeScoreView),
        (results.ScorePage, schemas.ScoreResult),  # a paged REST answer is this, encoded
    ],
)
def test_typed_results_have_the_documented_fields_in_order(
    typed: type, view: type[BaseModel]
) -> None:
    """The edges encode the dataclasses as they are (encoding.py): a field renamed,
    added or moved here would change the wire."""
    assert [f.name for f in dataclasses.fields(typed)] == list(view.model_fields)


def test_results_are_frozen() -> None:
    ended = results.Ended(("a",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ended.ids = ()  # type: ignore[misc]
