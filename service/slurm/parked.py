"""Pending jobs that will not start until something changes: their reservations go back.

The filter reserves GPUs for a job it places; Slurm then starts the job a
moment later. A job that is held (``sbatch --hold``, ``scontrol hold``) or
blocked by a partition, a node, a constraint or an accounting limit stays
pending, for minutes or for good, and a reservation held for it keeps its
GPUs from every other job. The reconcile loop releases the reservations of
such jobs; when one starts after all, the prolog (or the loop) records the
GPUs Slurm gave it, as for any job Slurm started by itself.

The reasons are Slurm 22.05's (``job_reason_string``, squeue's ``state_reason``).
A job pending for ``Resources`` or ``Priority`` waits for GPUs or its turn and
keeps its reservation; so do the passing ones: ``SchedDefer``, ``Cleaning``,
``Licenses``, burst buffer stage-in, power.
"""

from __future__ import annotations

from typing import Any

PARKED_REASONS = frozenset(
    {
        # Held: only `scontrol release` (or requeue limits being raised) starts it.
        "JobHeldUser",
        "JobHeldAdmin",
        "JobHoldMaxRequeue",
        # Held by Slurm when the reservation it was given (scontrol update) is deleted.
        "ReservationDeleted",
        # A held, requeued job after a failed launch shows why it was held.
        "JobLaunchFailure",
        "SystemFailure",
        # Its partition refuses it as it stands (state, size or time limits).
        "PartitionDown",
        "PartitionInactive",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        # No node can ever give what it asks, or a node it names is down.
        "BadConstraints",
        "NodeDown",
        "FrontEndDown",
        # Its account or QOS refuses it, or its dependency can never be met.
        "InvalidAccount",
        "InvalidQOS",
        "AccountNotAllowed",
        "QOSNotAllowed",
        "DependencyNeverSatisfied",
        # Waits for a moment, another job or a reservation, not for GPUs (a job the
        # filter saw deferred gets no reservation at all; one deferred later by
        # `scontrol update` gives its reservation back here).
        "BeginTime",
        "Dependency",
        "Reservation",
        "JobArrayTaskLimit",
        "AccountingPolicy",
    }
)
# Accounting limits (AssocMaxJobsLimit, AssocGrpGRES, QOSMaxGRESPerUser,
# MaxJobsPerAccount and some hundred more): the job waits until the user's,
# account's or QOS's other jobs end, whatever GPUs are free.
_LIMIT_PREFIXES = ("Assoc", "QOS", "Max")
# ReqNodeNotAvail: a node the job requires is down, drained or not responding
# ("UnavailableNodes:node2"), or in an advance reservation the job may not use ("May be
# reserved for other job", "Reserved for maintenance", Slurm 22.05's select_nodes): the job
# starts only once the node is back or the reservation is over, perhaps hours later, which
# a job pinned there before the drain or the reservation waits for holding its GPUs.
_UNAVAILABLE = "UnavailableNodes:"
_RESERVED = ("May be reserved for other job", "Reserved for maintenance")


def parked_reason(job: dict[str, Any]) -> str | None:
    """Why a pending job of ``squeue --json`` will not start without a change, or None."""
    reason = str(job.get("state_reason") or "")
    if not reason:
        return None
    if reason in PARKED_REASONS or reason.startswith(_LIMIT_PREFIXES):
        return reason
    if reason == "ReqNodeNotAvail":
        described = str(job.get("state_description") or "")
        nodes = described.partition(_UNAVAILABLE)[2].strip()
        if nodes:
            return f"{reason} ({nodes})"
        reserved = next((r for r in _RESERVED if r in described), None)
        return f"{reason} ({reserved})" if reserved else None
    return None
