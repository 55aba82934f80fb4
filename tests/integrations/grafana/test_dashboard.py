"""The Grafana dashboard: valid JSON, and every metric it queries is one the service exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.metrics.scrape import documented, family_name, parse

DASHBOARD = Path(__file__).resolve().parents[3] / "integrations" / "grafana" / "topoplace.json"
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def _exprs(node: Any) -> list[str]:
    """Every PromQL expression in the dashboard: panel targets and template queries."""
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        query = node.get("query")
        if isinstance(query, dict) and isinstance(query.get("query"), str):
            found.append(query["query"])
        return found + [e for value in node.values() for e in _exprs(value)]
    if isinstance(node, list):
        return [e for value in node for e in _exprs(value)]
    return []


def _family(sample: str) -> str:
    for suffix in SUFFIXES:
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample


def _queried() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dashboard)
    assert len(exprs) >= 20
    return {_family(m) for e in exprs for m in re.findall(r"\btopoplace_\w+", e)}


def test_every_metric_the_dashboard_queries_is_exported(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}", insecure_dev=True)
    with TestClient(create_app(settings, background=False)) as client:
        types, _ = parse(client.get("/metrics").text)
    missing = _queried() - set(types)
    assert not missing, f"the dashboard queries metrics the service does not export: {missing}"


def test_the_dashboard_shows_every_documented_metric() -> None:
    families = {family_name(name, kind) for name, kind in documented().items()}
    unshown = families - _queried()
    assert not unshown, f"metrics docs/metrics.md lists that no panel shows: {unshown}"


def test_panels_name_the_datasource_variable_and_do_not_overlap() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    taken: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"panel {panel['title']!r} overlaps another"
        taken |= cells
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"
