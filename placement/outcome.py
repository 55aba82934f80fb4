"""What the engine answers: a small, closed vocabulary of outcomes.

- ``placed``: the placement (per task: node, GPUs, cpuset, score, reason).
  The engine does not reserve anything: the caller commits and then calls
  ``ClusterState.allocate``.
- ``unschedulable``: nothing fits now, but something may later (GPUs busy,
  nodes cordoned or stale, GPUs unhealthy). Retry later.
- ``unresolvable``: no node could ever fit it as the cluster is built (e.g.
  16 NVLink-connected GPUs on 8-GPU nodes). Do not retry; change the request.

Failure reasons are grouped by cause with a count, so a 10,000-node answer
reads "9,950 nodes: fewer than 4 free GPUs", not 10,000 lines.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Cause(StrEnum):
    """Why a node cannot take a request. ``resolvable`` causes may clear by themselves."""

    NOT_REGISTERED = "not_registered"
    UNAVAILABLE = "unavailable"
    REGION = "region"
    LABELS = "labels"
    GPU_MODEL = "gpu_model"
    GPU_MEMORY = "gpu_memory"
    TOO_FEW_GPUS = "too_few_gpus"
    NO_NVLINK_SET_EVER = "no_nvlink_set_ever"
    NO_NUMA_SET_EVER = "no_numa_set_ever"
    NO_MIG_PROFILE = "no_mig_profile"
    UNHEALTHY = "unhealthy"
    BUSY = "busy"
    NO_NVLINK_SET_NOW = "no_nvlink_set_now"
    NO_NUMA_SET_NOW = "no_numa_set_now"
    NO_FREE_MIG = "no_free_mig"
    CPUS = "cpus"
    GANG = "gang"

    @property
    def resolvable(self) -> bool:
        return self in _RESOLVABLE


_RESOLVABLE = frozenset(
    {
        Cause.NOT_REGISTERED,
        Cause.UNAVAILABLE,
        Cause.UNHEALTHY,
        Cause.BUSY,
        Cause.NO_NVLINK_SET_NOW,
        Cause.NO_NUMA_SET_NOW,
        Cause.NO_FREE_MIG,
        Cause.CPUS,
        Cause.GANG,
    }
)


class ScoreParts(BaseModel):
    model_config = ConfigDict(frozen=True)

    ring_gbps: float = Field(description="bottleneck of the best ring through the GPUs")
    pair_sum_gbps: float = Field(description="sum of pairwise bandwidths")
    bandwidth: float = Field(
        description="ring relative to the best this node design can give, 0..1"
    )
    fragmentation: float = Field(
        description="what the node can still serve afterwards relative to before, 0..1 (1: no loss)"
    )
    numa_nodes: int = Field(description="NUMA nodes the GPUs touch")
    free_after: int = Field(description="GPUs left free on the node")


class TaskPlacement(BaseModel):
    model_config = ConfigDict(frozen=True)

    task: int
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    mig_uuids: tuple[str, ...] = ()
    cpuset: str = ""
    cpus: tuple[int, ...] = Field(
        default=(), description="CPUs reserved for the task, if any asked"
    )
    numa_nodes: tuple[int, ...] = ()
    islands: tuple[str, ...] = ()
    nvlink_connected: bool
    score: ScoreParts
    reason: str


class Placement(BaseModel):
    model_config = ConfigDict(frozen=True)

    tasks: tuple[TaskPlacement, ...]
    ring_gbps: float = Field(description="predicted ring bandwidth across all tasks' GPUs")
    fabric_domain: str | None = Field(default=None, description="multi-node NVLink domain used")
    network_blocks: tuple[str, ...] = ()
    reason: str

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.node for t in self.tasks))


class ReasonGroup(BaseModel):
    model_config = ConfigDict(frozen=True)

    cause: Cause
    nodes: int
    message: str
    resolvable: bool


class NodeVerdict(BaseModel):
    """One node's answer to a request, for scoring and scheduler filters."""

    model_config = ConfigDict(frozen=True)

    node: str
    fits: bool
    cause: Cause | None = None
    message: str = ""
    resolvable: bool = True
    rank: int | None = Field(default=None, description="1 = best node; None when it does not fit")
    score: float = Field(
        default=0.0, description="0..100, higher is better; 0 when it does not fit"
    )
    task: TaskPlacement | None = None


class Outcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    status: Literal["placed", "unschedulable", "unresolvable"]
    placement: Placement | None = None
    reasons: tuple[ReasonGroup, ...] = ()

    @property
    def placed(self) -> bool:
        return self.status == "placed"

    def summary(self) -> str:
        if self.placement is not None:
            return self.placement.reason
        return "; ".join(
            f"{g.nodes} node{'s' if g.nodes != 1 else ''}: {g.message}" for g in self.reasons
        )
