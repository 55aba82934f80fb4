"""A region's summary of itself, from its in-memory cluster: what the global service routes by.

Per node design (GPU model, GPU count and NVLink wiring): nodes, free GPUs,
and how many usable nodes have each largest free NVLink island; per
multi-node NVLink clique, its nodes and the wholly free ones; the stale
nodes; the live allocations. Read under the state lock in one pass over
the nodes, so it is one consistent picture.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime
from typing import Any

from placement.bandwidth import bandwidth_matrix
from placement.node_view import NodeView
from service.federation import summary_limits
from service.state import ServiceState


def _nvlink_sets(view: NodeView) -> list[tuple[int, ...]]:
    """The node's NVLink islands, each GPU of a PCIe group an island of one by itself."""
    sets: list[tuple[int, ...]] = []
    for island in view.islands:
        sets += [island.gpus] if island.is_nvlink else [(g,) for g in island.gpus]
    return sets


def design_of(view: NodeView) -> str:
    snapshot = view.snapshot
    model = snapshot.gpus[0].model if snapshot.gpus else "none"
    sizes = "+".join(str(len(gpus)) for gpus in _nvlink_sets(view))
    return f"{model} x{snapshot.gpu_count} nvl[{sizes}]"


def _largest_free_island(view: NodeView) -> int:
    free = view.free_mask
    return max((sum(1 for g in gpus if free >> g & 1) for gpus in _nvlink_sets(view)), default=0)


def summarize(
    state: ServiceState, region: str, seq: int, now: datetime, live: int
) -> dict[str, Any]:
    """The summary's JSON, as the region signs and sends it: cut to the global service's
    limits (summary_limits.py), or it would be refused, and the next one too."""
    designs: dict[str, dict[str, Any]] = {}
    by_island: dict[str, Counter[int]] = defaultdict(Counter)
    cliques: dict[str, dict[str, Any]] = {}
    gbps_of: dict[str, float] = {}
    stale = 0
    with state.lock:
        state.refresh_if_due()
        bandwidth = state.cluster.bandwidth
        for view in state.cluster.nodes():
            snapshot = view.snapshot
            if not snapshot.gpus:
                continue
            if state.is_stale(view.name):
                stale += 1
            design = design_of(view)
            entry = designs.get(design)
            if entry is None:
                matrix = bandwidth_matrix(snapshot, bandwidth)
                gbps_of[design] = float(matrix.max()) if matrix.size else 0.0
                entry = designs[design] = {
                    "design": design,
                    "gpu_model": snapshot.gpus[0].model,
                    "gpus_per_node": snapshot.gpu_count,
                    "nodes": 0,
                    "free_gpus": 0,
                }
            entry["nodes"] += 1
            wholly_free = False
            if view.available:
                free = view.free_mask.bit_count()
                entry["free_gpus"] += free
                by_island[design][_largest_free_island(view)] += 1
                wholly_free = free == snapshot.gpu_count
            fabric = snapshot.fabric
            if fabric is not None and fabric.usable:
                clique = cliques.setdefault(
                    fabric.domain,
                    {"domain": fabric.domain, "design": design, "nodes": 0, "free_nodes": 0},
                )
                clique["nodes"] += 1
                clique["free_nodes"] += int(wholly_free)
        network = bandwidth.network_gbps
    for design, entry in designs.items():
        entry["island_gbps"] = gbps_of[design]
        entry["by_island"] = {str(k): v for k, v in sorted(by_island[design].items()) if k > 0}
    return summary_limits.fit(
        {
            "region": region,
            "seq": seq,
            "sent_at": now.isoformat(),
            "designs": sorted(designs.values(), key=lambda d: d["design"]),
            "cliques": sorted(cliques.values(), key=lambda c: c["domain"]),
            "stale_nodes": stale,
            "live_allocations": live,
            "network_gbps": network,
        }
    )


def change_key(state: ServiceState) -> tuple[int, int]:
    """What moves whenever the summary could: the engine's membership version and its
    change clock (holds, availability). Cheap, so a quiet region skips the summary."""
    with state.lock:
        state.refresh_if_due()
        return state.cluster.version, state.cluster.clock


def content_of(summary: dict[str, Any]) -> dict[str, Any]:
    """What changes when the region changes: the summary without its seq and time."""
    return {k: v for k, v in summary.items() if k not in ("seq", "sent_at")}
