"""What a caller asks for: the placement request.

A request is ``tasks`` x ``gpus`` whole GPUs (a gang when tasks > 1: all or
nothing), ``tasks`` MIG instances of ``mig_profile``, or a share
(``gpu_fraction``) of one GPU for one task. The two axes of
choice are independent:

- ``objective`` decides which GPUs inside a node: ``performance`` (default)
  takes the best ring bandwidth; ``balanced`` accepts up to
  ``max_ring_loss`` less ring bandwidth when that leaves the node (and the
  cluster) better able to serve the requests that come next.
- ``policy`` decides which node: ``pack`` fills busy nodes first (best fit),
  ``spread`` prefers the emptiest nodes.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from placement.numbers import WHOLE, share_thousandths
from placement.text import PLAIN_PATTERN, Text, forbidden_character

Locality = Literal["nvlink", "prefer", "any"]
Policy = Literal["pack", "spread"]
Objective = Literal["performance", "balanced"]
NumaMode = Literal["required", "preferred", "ignore"]

# Counts are strict: JSON true or "4" is a mistake in the caller, not 1 or 4 GPUs.
# Every bound is far below what a signed 64-bit database column holds.
MAX_GPU_MEMORY_MIB = 2**31 - 1  # 2 PiB: well above any GPU
MAX_TASK_GPUS = 64  # GPUs one task may ask
GpuCount = Annotated[int, Field(strict=True, ge=1, le=MAX_TASK_GPUS), WHOLE]
MAX_TASKS = 4096  # tasks of one request (a gang's members)
TaskCount = Annotated[int, Field(strict=True, ge=1, le=MAX_TASKS), WHOLE]
CpuCount = Annotated[int, Field(strict=True, ge=0, le=4096), WHOLE]
MemoryMib = Annotated[int, Field(strict=True, ge=0, le=MAX_GPU_MEMORY_MIB), WHOLE]
# A task's host CPU in thousandths of a CPU, as Kubernetes' "500m": far past any host.
MAX_CPU_MILLI = 2**31 - 1
CpuMilli = Annotated[int, Field(strict=True, ge=0, le=MAX_CPU_MILLI), WHOLE]
Name = Annotated[Text, Field(min_length=1, max_length=253)]
# A name in a node list: the length is checked per name (in pydantic's core), the
# characters once per list (_plain_names). Text's check per name was a Python call per
# name: 52 ms of the event loop for 65,536 names, 5 ms this way.
ListedName = Annotated[
    str,
    StringConstraints(min_length=1, max_length=253),
    Field(json_schema_extra={"pattern": PLAIN_PATTERN}),
]
# prefix/name, as Kubernetes allows. An empty key names no label any node can carry: it
# was read as a filter nothing passes (409 "nothing fits") instead of a bad request.
LabelKey = Annotated[Text, Field(min_length=1, max_length=317)]
LabelValue = Annotated[Text, Field(max_length=63)]
# Entries of each filter list (models, regions, labels). Each model is matched against the
# GPU models of the fleet and every entry is named in refusals; unbounded, one request of
# 60,000 models held the decision for seconds.
MAX_FILTER_ENTRIES = 64
# Names in ``nodes`` and in ``exclude_nodes``: a scheduler names its candidates, thousands
# of them, but never more than the largest cluster served, which is the largest host list
# the Slurm filter expands (slurm_formats.hostlist.MAX_NAMES). Counted before any name is
# read: 380,000 names (a 4 MB body) took 150 ms of validation on the event loop.
MAX_NODE_NAMES = 65_536


def node_names_problem(count: int) -> str | None:
    """Why a list of ``count`` node names is refused, or None (REST and gRPC alike)."""
    if count <= MAX_NODE_NAMES:
        return None
    return (
        f"at most {MAX_NODE_NAMES} node names (the largest cluster served); this list has {count}"
    )


class PlacementRequest(BaseModel):
    # The document states the MIG rule of _consistent below, so that clients see it too.
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        json_schema_extra={
            "if": {"required": ["mig_profile"], "properties": {"mig_profile": {"type": "string"}}},
            "then": {
                "properties": {
                    "gpus": {"const": 1},
                    "locality": {"not": {"const": "nvlink"}},
                }
            },
        },
    )

    gpus: GpuCount = Field(default=1, description="GPUs per task")
    tasks: TaskCount = Field(default=1, description="tasks in the gang, all or nothing")
    mig_profile: Text | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="MIG profile per task (e.g. '1g.10gb') instead of whole GPUs",
    )
    gpu_fraction: float | None = Field(
        default=None,
        strict=True,  # as the counts: "0.5" in a string is a mistake, not half a GPU
        allow_inf_nan=False,  # else NaN was refused as "not less than 1"
        gt=0.0,
        lt=1.0,
        description="a share of one GPU for one task (0.25 = a quarter), as HAMi and the"
        " Alibaba trace express sharing: placed on a GPU already shared before a whole free"
        " one, never on a GPU a whole-GPU job holds",
    )
    locality: Locality = "prefer"
    policy: Policy = "pack"
    objective: Objective = "performance"
    max_ring_loss: float = Field(
        default=0.5,
        strict=True,
        allow_inf_nan=False,
        ge=0.0,
        lt=1.0,
        description="balanced only: share of ring bandwidth it may give up",
    )
    numa: NumaMode = "preferred"
    cpus_per_task: CpuCount = 0
    cpu_milli: CpuMilli | None = Field(
        default=None,
        description="host CPU per task in thousandths of a CPU (a pod's CPU request, 500 ="
        " half a CPU): counted on the node, which must have it free where its capacity is"
        " known; absent = not counted",
    )
    memory_mib: MemoryMib | None = Field(
        default=None,
        description="host memory per task in MiB, counted as cpu_milli is; absent = not counted",
    )
    gpu_models: tuple[Annotated[Text, Field(min_length=1, max_length=128)], ...] = Field(
        default=(),
        max_length=MAX_FILTER_ENTRIES,
        description="accepted GPU models, each matched as a whole token of the GPU name",
    )
    min_gpu_memory_mib: MemoryMib = 0
    node_labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_FILTER_ENTRIES,
        description="required node labels",
        json_schema_extra={
            "propertyNames": {"pattern": PLAIN_PATTERN, "minLength": 1, "maxLength": 317}
        },
    )
    regions: tuple[Annotated[Text, Field(min_length=1, max_length=63)], ...] = Field(
        default=(), max_length=MAX_FILTER_ENTRIES, description="allowed regions; empty = any"
    )
    nodes: tuple[ListedName, ...] | None = Field(
        default=None,
        max_length=MAX_NODE_NAMES,
        description="consider only these nodes (e.g. a scheduler's candidates)",
    )
    exclude_nodes: tuple[ListedName, ...] = Field(default=(), max_length=MAX_NODE_NAMES)
    # An empty job id was stored and could never be released by job id (the release
    # route has no empty segment; gRPC ReleaseJob refuses it): refused at placement.
    job_id: Text | None = Field(default=None, min_length=1, max_length=256)

    @field_validator("nodes", "exclude_nodes", mode="before")
    @classmethod
    def _few_enough_names(cls, value: object) -> object:
        # Before the names are read: pydantic checks max_length only after validating
        # every item, which is the cost the bound is there to avoid.
        if isinstance(value, list | tuple):
            problem = node_names_problem(len(value))
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("nodes", "exclude_nodes")
    @classmethod
    def _plain_names(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        # One search over all the names; the per-name walk only to say which one.
        if value is not None and forbidden_character("".join(value)) is not None:
            for index, name in enumerate(value):
                bad = forbidden_character(name)
                if bad is not None:
                    raise ValueError(
                        f"control characters are not allowed (found U+{ord(bad):04X}"
                        f" in name {index})"
                    )
        return value

    @field_validator("mig_profile")
    @classmethod
    def _lower_profile(cls, value: str | None) -> str | None:
        # An empty or blank profile is refused, not read as "whole GPUs": the caller
        # meant some profile, and "any" would hand out whole GPUs instead.
        if value is None:
            return None
        profile = value.strip().lower()
        if not profile:
            raise ValueError("a MIG profile name such as '1g.10gb', or leave it out")
        return profile

    @field_validator("gpu_fraction")
    @classmethod
    def _less_than_a_gpu(cls, value: float | None) -> float | None:
        # Counted rounded up to thousandths: past 0.999 a share would be the whole GPU,
        # answered as a fraction of it.
        if value is not None and share_thousandths(value) >= 1000:
            raise ValueError(
                f"{value} counts as 1000/1000 of a GPU (shares are counted in thousandths,"
                " rounded up): ask for a whole GPU with gpus=1"
            )
        return value

    @field_validator("gpu_models")
    @classmethod
    def _models(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # A blank model is refused rather than dropped: [""] read as "any model"
        # would place on GPUs the caller did not accept.
        cleaned = tuple(m.strip() for m in value)
        if any(not m for m in cleaned):
            raise ValueError("GPU models must not be blank")
        return cleaned

    @model_validator(mode="after")
    def _consistent(self) -> PlacementRequest:
        if self.mig_profile is not None and self.gpus != 1:
            raise ValueError("gpus must be 1 with mig_profile: each task gets one MIG instance")
        if self.gpu_fraction is not None and self.mig_profile is not None:
            # Named apart: a caller who sent gpus=1 and tasks=1 with a profile was told
            # to send gpus=1, tasks=1.
            raise ValueError(
                "gpu_fraction is a share of one whole GPU; mig_profile asks for MIG"
                " instances: send one or the other"
            )
        if self.gpu_fraction is not None and (self.gpus != 1 or self.tasks != 1):
            raise ValueError("gpu_fraction is a share of one GPU for one task: gpus=1, tasks=1")
        if self.mig_profile is not None and self.locality == "nvlink":
            raise ValueError("locality 'nvlink' does not apply to MIG instances")
        return self

    @property
    def share_milli(self) -> int:
        """The share in thousandths of a GPU (the trace's ``gpu_milli``); 0 for whole GPUs."""
        return 0 if self.gpu_fraction is None else share_thousandths(self.gpu_fraction)

    @property
    def counts_host(self) -> bool:
        """Whether the request carries host figures (CPU or memory per task) to count."""
        return self.cpu_milli is not None or self.memory_mib is not None

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.tasks
