"""What the engine answers: a small, closed vocabulary of outcomes.

- ``placed``: the placement (per task: node, GPUs, cpuset, score, reason).
  The engine does not reserve anything: the caller commits and then calls
  ``ClusterState.allocate``.
- ``unschedulable``: nothing fits now, but something may later (GPUs busy,
  nodes cordoned or stale, GPUs unhealthy). Retry later.
- ``unresolvable``: it could not be placed even if every node it may use
  were idle, healthy and available (e.g. 16 NVLink-connected GPUs on 8-GPU
  nodes, a gang larger than the cluster, a node name no agent reported). Do
  not retry; change the request. ``placement.capacity`` draws the line.

Failure reasons are grouped by cause with a count, so a 10,000-node answer
reads "9,950 nodes: fewer than 4 free GPUs", not 10,000 lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class Cause(StrEnum):
    """Why a node cannot take a request. ``resolvable`` causes may clear by themselves."""

    NOT_REGISTERED = "not_registered"
    UNAVAILABLE = "unavailable"
    REGION = "region"
    LABELS = "labels"
    GPU_MODEL = "gpu_model"
    GPU_MEMORY = "gpu_memory"
    TOO_FEW_GPUS = "too_few_gpus"
    # Enough GPUs in total, but some are in MIG mode: they take MIG requests only.
    MIG_MODE = "mig_mode"
    TOO_FEW_CPUS = "too_few_cpus"
    NO_NVLINK_SET_EVER = "no_nvlink_set_ever"
    NO_NUMA_SET_EVER = "no_numa_set_ever"
    NO_MIG_PROFILE = "no_mig_profile"
    UNHEALTHY = "unhealthy"
    BUSY = "busy"
    NO_NVLINK_SET_NOW = "no_nvlink_set_now"
    NO_NUMA_SET_NOW = "no_numa_set_now"
    NO_FREE_MIG = "no_free_mig"
    CPUS = "cpus"
    # The node's known free host CPU or memory is below the task's (cpu_milli, memory_mib).
    HOST = "host"
    GANG = "gang"

    @property
    def resolvable(self) -> bool:
        return self in _RESOLVABLE


# A node no agent has reported is not capacity that may come back: a request
# naming only such nodes is told to change (see placement.capacity).
_RESOLVABLE = frozenset(
    {
        Cause.UNAVAILABLE,
        Cause.UNHEALTHY,
        Cause.BUSY,
        Cause.NO_NVLINK_SET_NOW,
        Cause.NO_NUMA_SET_NOW,
        Cause.NO_FREE_MIG,
        Cause.CPUS,
        Cause.HOST,
        Cause.GANG,
    }
)


# Results are plain frozen dataclasses, not pydantic models: /place builds
# several per decision and validation would cost more than the decision
# itself. Every field comes from validated inputs. The service maps them to
# its own API schemas.


@dataclass(frozen=True, slots=True)
class ScoreParts:
    ring_gbps: float  # bottleneck of the best ring through the GPUs
    pair_sum_gbps: float  # sum of pairwise bandwidths
    bandwidth: float  # ring relative to the best this node design can give, 0..1
    fragmentation: float  # what the node can still serve afterwards vs before, 0..1 (1: no loss)
    numa_nodes: int  # NUMA nodes the GPUs touch
    free_after: int  # GPUs left free on the node


@dataclass(frozen=True, slots=True)
class TaskPlacement:
    task: int
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    nvlink_connected: bool
    score: ScoreParts
    reason: str
    mig_uuids: tuple[str, ...] = ()
    cpuset: str = ""
    cpus: tuple[int, ...] = ()  # CPUs reserved for the task, when the request asked for some
    numa_nodes: tuple[int, ...] = ()
    islands: tuple[str, ...] = ()
    gpu_fraction: float | None = None  # a share of the one GPU; None: whole GPUs
    cpu_milli: int = 0  # host CPU the task holds on the node (thousandths), 0: not counted
    memory_mib: int = 0  # host memory the task holds on the node, 0: not counted


@dataclass(frozen=True, slots=True)
class Placement:
    tasks: tuple[TaskPlacement, ...]
    ring_gbps: float  # predicted ring bandwidth across all tasks' GPUs
    reason: str
    fabric_domain: str | None = None  # multi-node NVLink domain used
    network_blocks: tuple[str, ...] = ()

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.node for t in self.tasks))


@dataclass(frozen=True, slots=True)
class ReasonGroup:
    cause: Cause
    nodes: int
    message: str
    resolvable: bool


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """One node's answer to a request, for scoring and scheduler filters."""

    node: str
    fits: bool
    cause: Cause | None = None
    message: str = ""
    resolvable: bool = True
    rank: int | None = None  # 1 = best node; None when it does not fit
    score: float = 0.0  # 0..100, higher is better; 0 when it does not fit
    task: TaskPlacement | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    status: Literal["placed", "unschedulable", "unresolvable"]
    placement: Placement | None = None
    reasons: tuple[ReasonGroup, ...] = ()
    # Said once about all the nodes the request may use, when that is why it
    # can never fit ("no node has 16 GPUs; the largest has 8"); the reasons
    # still give each node's cause.
    limit: str = ""

    @property
    def placed(self) -> bool:
        return self.status == "placed"

    def summary(self) -> str:
        if self.placement is not None:
            return self.placement.reason
        if self.limit:
            return self.limit
        return "; ".join(
            f"{g.nodes} node{'s' if g.nodes != 1 else ''}: {g.message}" for g in self.reasons
        )
