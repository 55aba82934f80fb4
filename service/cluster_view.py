"""GET /v1/cluster: capacity, free GPUs, fragmentation, counts by state."""

from __future__ import annotations

from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from placement import Health
from placement.cluster import FULL_SHARE
from service import schema
from service.deps import get_state
from service.state import ServiceState

router = APIRouter(prefix="/v1", tags=["cluster"])


class ClusterView(BaseModel):
    nodes: dict[str, int] = Field(description="node counts: total, ready, stale, cordoned")
    gpus: dict[str, int] = Field(
        description="GPU counts: total, healthy and unhealthy (as the agents report them;"
        " GPUs in MIG mode count as healthy or not like the others), free (whole GPUs free),"
        " mig_enabled (GPUs in MIG mode, given only as MIG instances), shared (GPUs holding"
        " shares of gpu_fraction requests; neither free nor whole), share_free_milli"
        " (thousandths of a GPU still free on shared GPUs that can take a share: healthy,"
        " not in MIG mode)"
    )
    fragmentation: float = Field(
        description="share of free GPUs outside the largest free NVLink island of their node"
        " (0: every free GPU can join its node's biggest NVLink job)"
    )
    allocations: dict[str, int] = Field(description="allocation counts by state")


def cluster_view(state: ServiceState) -> ClusterView:
    with state.engine.connect() as conn:
        rows = conn.execute(
            sa.select(schema.allocations.c.state, sa.func.count()).group_by(
                schema.allocations.c.state
            )
        ).all()
    nodes = {"total": 0, "ready": 0, "stale": 0, "cordoned": 0}
    gpus = {
        "total": 0,
        "healthy": 0,
        "unhealthy": 0,
        "free": 0,
        "mig_enabled": 0,
        "shared": 0,
        "share_free_milli": 0,
    }
    stranded = 0
    with state.lock:
        for name in state.cluster.names():
            entry = state.cluster.node(name)
            nodes["total"] += 1
            if name in state.cordoned:
                nodes["cordoned"] += 1
            elif state.is_stale(name):
                nodes["stale"] += 1
            else:
                nodes["ready"] += 1
            snap = entry.snapshot
            free = entry.free_mask
            gpus["total"] += snap.gpu_count
            # Not the engine's healthy mask: that leaves MIG-mode GPUs out (they are not
            # whole GPUs), and a GPU in MIG mode is not unhealthy.
            healthy = sum(g.health is Health.HEALTHY for g in snap.gpus)
            gpus["healthy"] += healthy
            gpus["unhealthy"] += snap.gpu_count - healthy
            gpus["free"] += free.bit_count()
            gpus["mig_enabled"] += sum(g.mig_enabled for g in snap.gpus)
            # The shared GPUs the snapshot lists, as "total" counts them: a share held on
            # a GPU the node no longer reports would count one over the node's GPUs.
            shared = entry.shares_by_index
            gpus["shared"] += len(shared)
            # Room only where a share can go, as "free" counts only whole GPUs a request
            # can get: an unhealthy (or MIG-mode) shared GPU is given no new share.
            placeable = entry.healthy_mask
            gpus["share_free_milli"] += sum(
                FULL_SHARE - m for g, m in shared.items() if placeable >> g & 1
            )
            island_free = [sum(free >> g & 1 for g in i.gpus) for i in entry.islands if i.is_nvlink]
            # A free GPU without NVLink is a job of one by itself.
            largest = max(island_free, default=0) or min(1, free.bit_count())
            stranded += free.bit_count() - largest
    fragmentation = stranded / gpus["free"] if gpus["free"] else 0.0
    return ClusterView(
        nodes=nodes,
        gpus=gpus,
        fragmentation=round(fragmentation, 4),
        allocations={state_name: int(count) for state_name, count in rows},
    )


@router.get("/cluster", response_model=ClusterView)
def get_cluster(state: Annotated[ServiceState, Depends(get_state)]) -> ClusterView:
    return cluster_view(state)
