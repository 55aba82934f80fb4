"""The host figures per task live in the allocation's own columns, which the syncs sum."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service import schema
from service.allocations.stored_request import host_figures
from service.state import ServiceState, host_use
from tests.service.helpers import add_nodes

BODIES: list[dict[str, Any]] = [
    {"gpus": 8, "tasks": 2, "cpu_milli": 100, "memory_mib": 64},  # a gang of two nodes
    {"gpus": 1, "cpu_milli": 1500, "memory_mib": 2048},
    {"gpus": 1, "cpu_milli": 250},
    {"gpus": 1, "memory_mib": 512},
    {"gpus": 1},
    {"gpus": 1, "cpu_milli": 7000, "memory_mib": 7000},  # released below: counts nothing
]


def _columns(state: ServiceState) -> dict[str, tuple[int | None, int | None]]:
    t = schema.allocations
    with state.engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.id, t.c.cpu_milli, t.c.memory_mib)).all()
    return {str(i): (c, m) for i, c, m in rows}


def test_place_writes_the_request_figures_into_the_columns(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    made = {}
    for body in BODIES[1:5]:
        placed = client.post("/v1/place", json=body)
        assert placed.status_code == 201, placed.text
        made[placed.json()["id"]] = (body.get("cpu_milli"), body.get("memory_mib"))
    assert _columns(state) == made


def test_host_use_sums_the_live_columns_per_task_on_each_node(client: TestClient) -> None:
    add_nodes(client, ("hgx-h100", "h0"), ("hgx-h100", "h1"), ("hgx-h100", "h2"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    expected: dict[str, tuple[int, int]] = {}
    placed = []
    for body in BODIES:
        answer = client.post("/v1/place", json=body)
        assert answer.status_code == 201, answer.text
        placed.append(answer.json())
    last = placed[-1]
    assert client.post(f"/v1/allocations/{last['id']}/release").status_code == 200
    for body, allocation in zip(BODIES[:-1], placed[:-1], strict=True):
        for task in allocation["tasks"]:
            c, m = expected.get(task["node"], (0, 0))
            expected[task["node"]] = (c + body.get("cpu_milli", 0), m + body.get("memory_mib", 0))
    with state.engine.connect() as conn:
        assert host_use(conn, None) == expected
        # Named nodes: their allocations, whole (a gang's tasks elsewhere included).
        for node, used in expected.items():
            assert host_use(conn, [node])[node] == used
    assert len(expected) == 3
    for node, used in expected.items():
        assert state.cluster.host_used(node) == used


def test_a_request_whose_labels_read_like_a_figure_counts_nothing(client: TestClient) -> None:
    # A row stored before the figures existed, asking for a label named like one: its
    # text matches '"cpu_milli":' as a LIKE pattern ('_' matches any character) though
    # it names no figure. Its node holds no host use, not an entry of zero.
    add_nodes(client, ("hgx-h100", "h0"))
    state: ServiceState = client.app.state.service  # type: ignore[attr-defined]
    placed = client.post("/v1/place", json={"gpus": 1})
    assert placed.status_code == 201, placed.text
    t = schema.allocations
    with state.engine.begin() as conn:
        conn.execute(
            sa.update(t)
            .where(t.c.id == placed.json()["id"])
            .values(request='{"gpus":1,"tasks":1,"node_labels":{"cpu-milli":"5"}}')
        )
    with state.engine.connect() as conn:
        assert host_use(conn, None) == {}
        assert host_use(conn, ["h0"]) == {}


def test_host_figures_reads_each_figure_the_request_names() -> None:
    assert host_figures('{"gpus":1,"cpu_milli":500,"memory_mib":null}') == {
        "cpu_milli": 500,
        "memory_mib": None,
    }
    assert host_figures('{"gpus":1}') == {"cpu_milli": None, "memory_mib": None}
    assert host_figures('{"cpu_milli":true,"memory_mib":"5"}') == {
        "cpu_milli": None,
        "memory_mib": None,
    }
    assert host_figures("not json") == {"cpu_milli": None, "memory_mib": None}
