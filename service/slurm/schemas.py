"""API shapes of the Slurm adapter: what job_submit.lua / cli_filter.lua send, what they get."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from placement.numbers import WHOLE
from placement.text import Text

# Slurm's "not set" markers: NO_VAL (32 bit), NO_VAL16, and INFINITE variants.
_UNSET_NUMBERS = {0xFFFFFFFE, 0xFFFFFFFF, 0xFFFE, 0xFFFF}
# A job has at most this many nodes or tasks (Slurm's own limits are 32-bit).
MAX_COUNT = 2**31 - 1
Count = Annotated[int, Field(strict=True, ge=0, le=MAX_COUNT), WHOLE]
# A reservation's owner is slurm:<user>, at most 256 characters as any owner.
MAX_USER_NAME = 256 - len("slurm:")


class JobSubmit(BaseModel):
    """The fields of Slurm's ``job_desc`` the adapter reads (names as job_submit.lua has them).

    Numbers the user did not set arrive as Slurm's NO_VAL (4294967294) and
    are read as unset. Unknown fields are ignored, so a newer script can send more.
    """

    model_config = ConfigDict(extra="ignore")

    tres_per_job: Text | None = None
    tres_per_node: Text | None = None
    tres_per_task: Text | None = None
    tres_per_socket: Text | None = None
    min_nodes: Count | None = None
    max_nodes: Count | None = None
    num_tasks: Count | None = None
    features: Text | None = Field(default=None, description="--constraint")
    req_nodes: Text | None = Field(default=None, description="--nodelist, a Slurm host list")
    exc_nodes: Text | None = Field(default=None, description="--exclude, a Slurm host list")
    partition: Text | None = None
    partition_nodes: Text | None = Field(
        default=None,
        description="host list of the job's partition(s), as the script finds it in part_list;"
        " only these nodes are considered",
    )
    array_inx: Text | None = Field(default=None, description="--array: a job array")
    dependency: Text | None = Field(
        default=None,
        description="--dependency: the job waits for other jobs, so it is left to Slurm"
        " with nothing reserved",
    )
    begin_in_s: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="--begin, in seconds from now (0 or less: it may start now); a job that"
        " may start only later is left to Slurm with nothing reserved",
    )
    held: bool = Field(
        default=False,
        strict=True,
        description="--hold (priority 0): the job waits for scontrol release, so it is left"
        " to Slurm with nothing reserved",
    )
    reservation: Text | None = Field(
        default=None,
        description="--reservation: its nodes are the reservation's, so the job is left to"
        " Slurm with nothing reserved",
    )
    exclusive: bool = Field(
        default=False,
        strict=True,
        description="--exclusive, or a partition with OverSubscribe=EXCLUSIVE: Slurm gives"
        " the job every GPU of a node no other job uses,"
        " so it is left to Slurm with nothing reserved",
    )
    user_name: Text | None = Field(default=None, max_length=MAX_USER_NAME)
    name: Text | None = Field(default=None, description="job name")
    comment: Text | None = Field(default=None, description="may carry 'topoplace:' options")
    batch: bool = Field(
        default=True, strict=True, description="a batch job (sbatch): environment can be set"
    )
    reserve: bool = Field(
        default=True,
        strict=True,
        description="false: only say what would be chosen (cli_filter.lua); nothing is reserved",
    )

    @field_validator("min_nodes", "max_nodes", "num_tasks", mode="before")
    @classmethod
    def _unset(cls, value: Any) -> Any:
        if (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and value in _UNSET_NUMBERS
        ):
            return None
        return value

    @field_validator(
        "tres_per_job",
        "tres_per_node",
        "tres_per_task",
        "tres_per_socket",
        "features",
        "req_nodes",
        "exc_nodes",
        "partition",
        "partition_nodes",
        "array_inx",
        "dependency",
        "reservation",
        "comment",
        mode="before",
    )
    @classmethod
    def _empty(cls, value: Any) -> Any:
        return None if value == "" else value


Action = Literal["modify", "unchanged", "refuse"]


class JobDecision(BaseModel):
    """What the script does with the job.

    - ``modify``: write every ``set`` field into job_desc (and, for batch jobs,
      ``environment``); the job runs on exactly these nodes and GPUs;
    - ``unchanged``: let the job through as it is, logging ``message``;
    - ``refuse``: refuse the submission, showing ``message`` to the user.
    """

    action: Action
    message: str
    set: dict[str, str] = Field(
        default_factory=dict, description="job_desc fields to write, e.g. req_nodes, tres_per_node"
    )
    environment: dict[str, str] = Field(default_factory=dict)
    allocation_ids: list[str] = Field(default_factory=list)
    nodes: list[str] = Field(default_factory=list)
    gpu_indices: list[int] = Field(
        default_factory=list, description="the GPUs on each node of the job"
    )
    gres: str = Field(default="", description="the same GPUs as an --gres value (cli_filter)")


class ReconcileResult(BaseModel):
    released: list[str] = Field(description="allocations released: their job is gone")
    live_jobs: int = Field(description="jobs Slurm still has that hold a topoplace allocation")
    observed: list[str] = Field(
        default_factory=list,
        description="allocations moved or created to match what a running job really holds",
    )
    attached: list[str] = Field(
        default_factory=list, description="allocations that learned their Slurm job id"
    )


class JobStarted(BaseModel):
    """What the prolog (PrologSlurmctld) sends when a job starts."""

    show_job: str = Field(
        max_length=200_000, description="the output of `scontrol -d show job -o JOBID`"
    )
    job_name: str = Field(
        max_length=200_000,
        description="the job's name, SLURM_JOB_NAME: it tells the name, which the user"
        " writes, from the fields that follow it in show_job",
    )


class JobStartedResult(BaseModel):
    action: Literal["none", "matched", "attached", "moved", "created"] = Field(
        description="none: no GPU of a node topoplace knows, the text says the job has"
        " ended, or the job's end was said already (its epilog or the reconcile loop"
        " released it; the report came after it): nothing is written, `message` says"
        " which; matched/attached: the"
        " allocation said so already (attached: and now carries the job id); moved: an"
        " allocation of the job now holds the GPUs it runs on; created: it had none"
    )
    job_id: str
    allocation_id: str | None = None
    superseded: list[str] = Field(
        default_factory=list, description="stale allocations that held those GPUs, released"
    )
    merged: list[str] = Field(
        default_factory=list, description="the job's other allocations, ended into one"
    )
    message: str | None = Field(
        default=None, description="with action none: why nothing was written"
    )
