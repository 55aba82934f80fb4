"""API shapes for placements and allocations."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from placement import PlacementRequest
from placement.text import Text
from service.allocations.results import AllocationState as AllocationState  # one definition

# The bounds any service accepts: a tenth of a second at least (1e-300 expires at once),
# about 31 years at most (the expiry stays a timestamp the database holds). Within
# them the operator's own limits apply, TOPOPLACE_MIN_RESERVATION_TTL_S (1 s by
# default: a shorter reservation expires before its caller can confirm it) and
# TOPOPLACE_MAX_RESERVATION_TTL_S, each a 400 bad_request naming the setting.
MIN_TTL_S = 0.1
MAX_TTL_S = 1e9

PRIORITY_REMOVED = (
    "removed from the API: priority never had an effect on placement; leave it out"
    " (docs/service.md, 'priority removed')"
)


class ApiPlacementRequest(PlacementRequest):
    """The request as /v1/place and /v1/score take it: fields removed from the API
    are refused by name, so that a caller learns why instead of reading a bare
    'extra inputs are not permitted'."""

    # Not in the OpenAPI document (the request forbids unknown fields, so it is
    # documented as refused) and never in a dump: it only carries the refusal.
    priority: SkipJsonSchema[None] = Field(default=None, exclude=True)

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_removed(cls, value: object) -> None:
        raise PydanticCustomError("removed_field", PRIORITY_REMOVED)


class PlaceRequest(ApiPlacementRequest):
    """A placement request plus what the service keeps about the reservation."""

    owner: Text | None = Field(default=None, max_length=256, description="who asked (user, team)")
    ttl_s: float | None = Field(
        default=None,
        strict=True,
        allow_inf_nan=False,
        ge=MIN_TTL_S,
        le=MAX_TTL_S,
        description="seconds the reservation stays pending before it expires unless confirmed;"
        " the service default when omitted",
    )


class ScoreView(BaseModel):
    ring_gbps: float
    pair_sum_gbps: float
    bandwidth: float = Field(description="ring relative to the best this node design gives, 0..1")
    fragmentation: float = Field(description="what the node can still serve afterwards, 0..1")
    numa_nodes: int
    free_after: int


class ScoreTaskView(BaseModel):
    """What a node would give one task (/score reserves nothing, so no environment)."""

    task: int
    node: str
    gpu_indices: list[int]
    gpu_uuids: list[str]
    mig_uuids: list[str]
    cpuset: str
    cpus: list[int]
    numa_nodes: list[int]
    islands: list[str]
    nvlink_connected: bool
    score: ScoreView
    reason: str


class TaskView(ScoreTaskView):
    """A reserved task: what it holds and the environment to launch it with."""

    env: dict[str, str] = Field(description="environment for the task, e.g. CUDA_VISIBLE_DEVICES")
    gpu_fraction: float | None = Field(
        default=None,
        description="the share of its one GPU the task holds (a gpu_fraction request); null:"
        " its GPUs are whole. Nothing on the node enforces a share (docs/service.md)",
    )


class AllocationView(BaseModel):
    id: str
    state: AllocationState
    job_id: str | None
    owner: str | None
    tasks: list[TaskView]
    ring_gbps: float
    fabric_domain: str | None
    network_blocks: list[str]
    reason: str
    created_at: datetime
    expires_at: datetime | None
    ended_at: datetime | None


class AllocationList(BaseModel):
    allocations: list[AllocationView]


class ReleaseResult(BaseModel):
    released: list[str] = Field(description="ids of the allocations released by this call")


class ExtendRequest(BaseModel):
    # An unknown field is refused, not dropped: a misspelt one was read as left out.
    model_config = ConfigDict(extra="forbid")

    ttl_s: float = Field(
        strict=True,
        allow_inf_nan=False,
        ge=MIN_TTL_S,
        le=MAX_TTL_S,
        description="new time to live from now, in seconds",
    )


class ScoreRequest(ApiPlacementRequest):
    """Rank nodes for a request without reserving anything (``nodes``: only these)."""


class NodeScoreView(BaseModel):
    node: str
    fits: bool
    rank: int | None
    score: float
    cause: str | None
    message: str
    resolvable: bool
    task: ScoreTaskView | None


class ScoreResult(BaseModel):
    nodes: list[NodeScoreView]
    total: int | None = Field(default=None, description="paged answers: nodes in all pages")
    offset: int | None = Field(default=None, description="paged answers: this page's start")
    next_offset: int | None = Field(
        default=None, description="paged answers: the next page's offset; null on the last"
    )
