"""What the allocations API answers: frozen, typed, and named as the wire names them.

Every caller (REST, gRPC, the Kubernetes and Slurm adapters, the reconcilers,
the sweep) gets these, never JSON: attributes instead of string keys, so a
renamed field is a type error, not a KeyError in an adapter. They are plain
frozen dataclasses with slots, not pydantic models: /place builds one per
decision and /score hundreds, and validation would cost more than the
decision (the values come from validated requests and the engine).

Field names and order are the documented views' (service/allocations/schemas.py:
``AllocationView``, ``TaskView``, ``ScoreTaskView``, ``NodeScoreView``), so
the edges encode them directly (encoding.py); a test holds them equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

AllocationState = Literal["pending", "active", "degraded", "released", "expired"]


@dataclass(frozen=True, slots=True)
class TaskScore:
    ring_gbps: float
    pair_sum_gbps: float
    bandwidth: float
    fragmentation: float
    numa_nodes: int
    free_after: int


@dataclass(frozen=True, slots=True)
class TaskPlan:
    """What a node gives (or would give) one task; a /score row's task, which reserves
    nothing and so carries no environment."""

    task: int
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    mig_uuids: tuple[str, ...]
    cpuset: str
    cpus: tuple[int, ...]
    numa_nodes: tuple[int, ...]
    islands: tuple[str, ...]
    nvlink_connected: bool
    score: TaskScore
    reason: str

    @property
    def devices(self) -> tuple[str, ...]:
        """What the task holds: its MIG instances, else its whole GPUs (by UUID)."""
        return self.mig_uuids or self.gpu_uuids


@dataclass(frozen=True, slots=True)
class Task(TaskPlan):
    """A reserved task: its plan and the environment to launch it with; for a share of
    its one GPU, the share (``gpu_fraction``; None: the GPUs are whole)."""

    env: Mapping[str, str]
    gpu_fraction: float | None = None


@dataclass(frozen=True, slots=True)
class Allocation:
    id: str
    state: AllocationState
    job_id: str | None
    owner: str | None
    tasks: tuple[Task, ...]
    ring_gbps: float
    fabric_domain: str | None
    network_blocks: tuple[str, ...]
    reason: str
    created_at: datetime
    expires_at: datetime | None
    ended_at: datetime | None

    @property
    def live(self) -> bool:
        """Whether it holds GPUs (pending, active or degraded)."""
        return self.state in ("pending", "active", "degraded")

    def gpus_by_node(self) -> dict[str, tuple[int, ...]]:
        """Node -> the GPU indices held there, sorted (tasks on one node merged)."""
        merged: dict[str, set[int]] = {}
        for task in self.tasks:
            merged.setdefault(task.node, set()).update(task.gpu_indices)
        return {node: tuple(sorted(gpus)) for node, gpus in merged.items()}


@dataclass(frozen=True, slots=True)
class Placed:
    """A /place answer: the allocation, and whether this call made it (False: the
    allocation an ``Idempotency-Key`` made before, replayed); ``expired``: the replay
    found that reservation past its TTL, not yet swept, and expired it then and there."""

    allocation: Allocation
    created: bool
    expired: bool = False


@dataclass(frozen=True, slots=True)
class Ended:
    """The allocations one call ended (released or expired), in the order ended; none
    when there was nothing to end (releasing an ended allocation is a no-op)."""

    ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeScore:
    """One node's verdict for a /score request (NodeScoreView)."""

    node: str
    fits: bool
    rank: int | None
    score: float
    cause: str | None
    message: str
    resolvable: bool
    task: TaskPlan | None


@dataclass(frozen=True, slots=True)
class ScorePage:
    """A bounded /score answer (REST ``?limit=&offset=``, gRPC ``limit``, ``offset``): a
    slice of one ranking, the nodes in the whole answer, where the next page starts
    (None on the last)."""

    nodes: tuple[NodeScore, ...]
    total: int
    offset: int
    next_offset: int | None


ObservedAction = Literal["matched", "attached", "moved", "created", "ended"]


@dataclass(frozen=True, slots=True)
class Observation:
    """What ``observe`` did to make the database say what the scheduler runs.

    ``action``: ``matched`` (it said so already), ``attached`` (and now carries the
    job id), ``moved`` (an allocation of the job took the GPUs the job runs on),
    ``created`` (the job had none) or ``ended`` (a report of the job's start processed
    after its end was said: nothing written, ``allocation_id`` empty). ``superseded``:
    other allocations that held those GPUs, released; ``merged``: the job's further
    allocations, ended because one now holds all its GPUs; ``attached``: the job's
    allocations that learnt its id (when the action is ``attached``)."""

    action: ObservedAction
    allocation_id: str
    superseded: tuple[str, ...] = ()
    merged: tuple[str, ...] = ()
    attached: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NotObserved:
    """A truth ``observe_all`` did not take, and why, while it took the others: a gang
    task whose allocation ended, that is not on the node reported, or whose new GPUs
    another task of its own allocation holds (nothing is held twice)."""

    allocation_id: str
    message: str
