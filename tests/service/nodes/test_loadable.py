"""Every snapshot the service accepts, the engine loads and serves; the rest are refused.

A property test over snapshots that pass the model's validation: what the
edge check lets through must survive what the service does with a stored
snapshot (read it back from its JSON, upsert it, decide on it, render its
topology); what it refuses is an InvalidSnapshot, never another error.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from placement import ClusterState, NodeSnapshot, PlacementRequest
from placement.profiles import build_profile
from placement.topo_text import render_topo_matrix
from service.nodes.loadable import InvalidSnapshot, check_loadable

LABELS = ["NV1", "NV2", "NV4", "NV12", "NV18", "NVS18", "PIX", "PXB", "PHB", "NODE", "SYS"]
MODELS = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-32GB", "x"]


@st.composite
def snapshot_bodies(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.sampled_from([0, 1, 2, 3, 4, 8, 16, 17, 63]))
    numa = [{"id": i, "cpus": f"{8 * i}-{8 * i + 7}"} for i in range(draw(st.integers(0, 2)))]
    gpus = [
        {
            "index": i,
            "uuid": f"GPU-{i}",
            "model": draw(st.sampled_from(MODELS)),
            "memory_mib": draw(st.sampled_from([0, 81920, 2**62])),
            "numa_node": draw(st.sampled_from([None, *(node["id"] for node in numa)])),
            "health": draw(st.sampled_from(["healthy", "unhealthy"])),
            "mig_enabled": draw(st.booleans()),
        }
        for i in range(n)
    ]
    links = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            links[i][j] = links[j][i] = draw(st.sampled_from(LABELS))
    migs = []
    parents = [g["index"] for g in gpus if g["mig_enabled"]]
    for k, parent in enumerate(parents[: draw(st.integers(0, 3))]):
        migs.append(
            {
                "uuid": f"MIG-{k}",
                "parent_gpu": parent,
                "profile": draw(st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb"])),
                "placement_start": draw(st.sampled_from([0, 4, 100])),
                "placement_size": draw(st.sampled_from([1, 4, 8])),
            }
        )
    return {"name": "n", "numa_nodes": numa, "gpus": gpus, "links": links, "mig_instances": migs}


def _serve(snap: NodeSnapshot) -> None:
    """What the service does with a stored snapshot, on a state of its own."""
    cluster = ClusterState()
    cluster.upsert(NodeSnapshot.model_validate_json(snap.model_dump_json()))
    for gpus in (1, 2, 8):
        cluster.place(PlacementRequest(gpus=gpus))
    cluster.place(PlacementRequest(gpus=1, cpus_per_task=2))
    if snap.mig_instances:
        cluster.place(PlacementRequest(gpus=1, mig_profile=snap.mig_instances[0].profile))
    render_topo_matrix(snap)


@settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(snapshot_bodies())
def test_what_the_edge_accepts_the_engine_serves(body: dict[str, Any]) -> None:
    try:
        snap = NodeSnapshot.model_validate(body)
    except ValidationError:
        return  # refused by the model: 422 before the service sees it
    try:
        stored = check_loadable(snap, ClusterState())
    except InvalidSnapshot as refused:
        assert refused.status == 422 and refused.detail["field"].startswith("snapshot")
        return
    assert NodeSnapshot.model_validate_json(stored) == snap
    _serve(snap)


def test_the_known_breakers_are_refused_by_the_edge() -> None:
    with pytest.raises(InvalidSnapshot, match="at least one GPU"):
        check_loadable(NodeSnapshot(name="cpu0"), ClusterState())
    many = 64
    with pytest.raises(ValidationError, match="at most 63 items"):
        NodeSnapshot.model_validate(
            {
                "name": "big",
                "gpus": [{"index": i, "uuid": f"G{i}", "model": "x"} for i in range(many)],
                "links": [["X" if i == j else "SYS" for j in range(many)] for i in range(many)],
            }
        )


def test_the_check_leaves_the_live_state_alone() -> None:
    live = ClusterState()
    snap = build_profile("dgx2-v100", "d0")
    check_loadable(snap, live)
    assert "d0" not in live and live.class_count == 0
