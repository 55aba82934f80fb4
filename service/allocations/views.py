"""Typed results from what the service holds: the engine's tasks and the stored rows.

An allocation is stored with its placement as JSON text (the ``placement``
column: the tasks as the API shows them, environment included); this module
writes that record from the engine's answer and reads it back into
:class:`~service.allocations.results.Allocation`. Encoding for the wire is
encoding.py's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, cast

from placement import Placement, ScoreParts, TaskPlacement
from service.allocations.results import Allocation, AllocationState, Task, TaskPlan, TaskScore


def _score(parts: ScoreParts) -> TaskScore:
    return TaskScore(
        parts.ring_gbps,
        parts.pair_sum_gbps,
        parts.bandwidth,
        parts.fragmentation,
        parts.numa_nodes,
        parts.free_after,
    )


# TaskPlan's fields, in order: typed so that a field added to one side fails the check.
PlanFields = tuple[
    int,
    str,
    tuple[int, ...],
    tuple[str, ...],
    tuple[str, ...],
    str,
    tuple[int, ...],
    tuple[int, ...],
    tuple[str, ...],
    bool,
    TaskScore,
    str,
]


def _plan_fields(task: TaskPlacement) -> PlanFields:
    """The fields a TaskPlan and a Task share, in their order (a Task adds ``env``)."""
    return (
        task.task,
        task.node,
        task.gpu_indices,
        task.gpu_uuids,
        task.mig_uuids,
        task.cpuset,
        task.cpus,
        task.numa_nodes,
        task.islands,
        task.nvlink_connected,
        _score(task.score),
        task.reason,
    )


def task_plan(task: TaskPlacement) -> TaskPlan:
    """What the engine chose for a task, as /score shows it (no environment)."""
    return TaskPlan(*_plan_fields(task))


def reserved_task(task: TaskPlacement) -> Task:
    """A task of a reservation: its plan and the environment to launch it with. Devices
    are named by UUID: indices differ inside containers, UUIDs do not."""
    visible = ",".join(task.mig_uuids or task.gpu_uuids)
    env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
    if task.cpuset:
        env["TOPOPLACE_CPUSET"] = task.cpuset
    return Task(*_plan_fields(task), env, task.gpu_fraction)


def _task_record(task: Task) -> dict[str, Any]:
    score = task.score
    return {
        "task": task.task,
        "node": task.node,
        "gpu_indices": task.gpu_indices,
        "gpu_uuids": task.gpu_uuids,
        "mig_uuids": task.mig_uuids,
        "cpuset": task.cpuset,
        "cpus": task.cpus,
        "numa_nodes": task.numa_nodes,
        "islands": task.islands,
        "nvlink_connected": task.nvlink_connected,
        "score": {
            "ring_gbps": score.ring_gbps,
            "pair_sum_gbps": score.pair_sum_gbps,
            "bandwidth": score.bandwidth,
            "fragmentation": score.fragmentation,
            "numa_nodes": score.numa_nodes,
            "free_after": score.free_after,
        },
        "reason": task.reason,
        "env": task.env,
        "gpu_fraction": task.gpu_fraction,
    }


def placement_text(placement: Placement, tasks: tuple[Task, ...]) -> str:
    """The ``placement`` column for a reservation of these tasks.

    json's spacing, not orjson's: repository.listing matches '"node": "<name>"' in
    the stored text, including rows written by earlier versions."""
    return json.dumps(
        {
            "tasks": [_task_record(t) for t in tasks],
            "ring_gbps": placement.ring_gbps,
            "fabric_domain": placement.fabric_domain,
            "network_blocks": placement.network_blocks,
            "reason": placement.reason,
        }
    )


def aware(value: datetime) -> datetime:
    """SQLite hands back naive datetimes for timezone-aware columns; they are UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _maybe(value: datetime | None) -> datetime | None:
    return None if value is None else aware(value)


def _task(record: Mapping[str, Any]) -> Task:
    # .get for the lists: a row is read as it was written, by whichever version.
    score = record["score"]
    return Task(
        record["task"],
        record["node"],
        tuple(record["gpu_indices"]),
        tuple(record["gpu_uuids"]),
        tuple(record.get("mig_uuids", ())),
        record.get("cpuset", ""),
        tuple(record.get("cpus", ())),
        tuple(record.get("numa_nodes", ())),
        tuple(record.get("islands", ())),
        record["nvlink_connected"],
        TaskScore(
            score["ring_gbps"],
            score["pair_sum_gbps"],
            score["bandwidth"],
            score["fragmentation"],
            score["numa_nodes"],
            score["free_after"],
        ),
        record["reason"],
        record.get("env", {}),
        record.get("gpu_fraction"),
    )


def allocation(
    row: Mapping[Any, Any],
    tasks: tuple[Task, ...] | None = None,
    placement: Placement | None = None,
) -> Allocation:
    """An allocation from its row; ``tasks`` and ``placement``: what the caller has just
    stored, so that the placement text need not be read back."""
    if tasks is None or placement is None:
        stored = json.loads(row["placement"])
        tasks = tuple(_task(t) for t in stored["tasks"])
        ring, fabric, blocks, reason = (
            stored["ring_gbps"],
            stored["fabric_domain"],
            tuple(stored["network_blocks"]),
            stored["reason"],
        )
    else:
        ring, fabric, blocks, reason = (
            placement.ring_gbps,
            placement.fabric_domain,
            placement.network_blocks,
            placement.reason,
        )
    return Allocation(
        row["id"],
        cast(AllocationState, row["state"]),
        row["job_id"],
        row["owner"],
        tasks,
        ring,
        fabric,
        blocks,
        reason,
        aware(row["created_at"]),
        _maybe(row["expires_at"]),
        _maybe(row["ended_at"]),
    )
