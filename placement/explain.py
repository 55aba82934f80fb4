"""Words for people: failure messages by cause, and one-line reasons."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from placement.outcome import Cause, NodeVerdict, ReasonGroup
from placement.request import PlacementRequest


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _gpus(request: PlacementRequest) -> str:
    return _plural(request.gpus, "GPU")


# Entries of a request's list named in a message: every node's message names them, and
# a /score answer lists a message per node.
SHOWN = 5


def some_of(items: Sequence[str], joiner: str = ", ", last: str = "and") -> str:
    """``items`` joined, the first ``SHOWN`` of a longer list and how many more."""
    if len(items) <= SHOWN:
        return joiner.join(items)
    return f"{joiner.join(items[:SHOWN])} {last} {len(items) - SHOWN} more"


def models(request: PlacementRequest) -> str:
    return some_of(request.gpu_models, " or ", "or")


def _labels(request: PlacementRequest) -> str:
    return some_of([f"{key}={val}" for key, val in sorted(request.node_labels.items())])


# One sentence per cause, built only for the causes a refusal names: building
# every sentence per call cost a refusal more than grouping 10,000 nodes did.
_MESSAGES: dict[Cause, Callable[[PlacementRequest], str]] = {
    Cause.NOT_REGISTERED: lambda r: "no topoplace agent has reported this node",
    Cause.UNAVAILABLE: lambda r: "node is cordoned or its agent is stale",
    Cause.REGION: lambda r: f"not in an allowed region ({some_of(r.regions)})",
    Cause.LABELS: lambda r: "node labels do not match " + _labels(r),
    Cause.GPU_MODEL: lambda r: f"fewer than {_gpus(r)} of model {models(r)}",
    Cause.GPU_MEMORY: lambda r: f"fewer than {_gpus(r)} with at least {r.min_gpu_memory_mib} MiB",
    Cause.TOO_FEW_GPUS: lambda r: f"fewer than {_gpus(r)} in total",
    Cause.MIG_MODE: lambda r: (
        f"fewer than {_plural(r.gpus, 'whole GPU')}: the others are in MIG mode"
        " (they take MIG requests, mig_profile)"
    ),
    Cause.TOO_FEW_CPUS: lambda r: f"fewer than {_plural(r.cpus_per_task, 'CPU')} in total",
    Cause.NO_NVLINK_SET_EVER: lambda r: f"no {_gpus(r)} connected by NVLink on this node design",
    Cause.NO_NUMA_SET_EVER: lambda r: f"no {_gpus(r)} on one NUMA node on this node design",
    Cause.NO_MIG_PROFILE: lambda r: f"no MIG instances of profile {r.mig_profile or ''}",
    Cause.UNHEALTHY: lambda r: f"fewer than {_gpus(r)} healthy",
    Cause.BUSY: lambda r: f"fewer than {_gpus(r)} free",
    Cause.NO_NVLINK_SET_NOW: lambda r: f"no NVLink island with {_gpus(r)} free",
    Cause.NO_NUMA_SET_NOW: lambda r: f"no NUMA node with {_gpus(r)} free",
    Cause.NO_FREE_MIG: lambda r: f"no free MIG instance of profile {r.mig_profile or ''}",
    Cause.CPUS: lambda r: f"not enough free CPUs near the GPUs ({r.cpus_per_task} per task)",
    Cause.HOST: lambda r: (
        "not enough host CPU or memory free"
        f" ({r.cpu_milli or 0} milli-CPU, {r.memory_mib or 0} MiB per task)"
    ),
    Cause.GANG: lambda r: f"cannot hold {r.tasks} tasks of {_gpus(r)} together",
}


def cause_message(cause: Cause, request: PlacementRequest) -> str:
    return _MESSAGES[cause](request)


def group_reasons(
    counts: Mapping[Cause, int], request: PlacementRequest
) -> tuple[ReasonGroup, ...]:
    """One group per cause, the most nodes first (then by name, so the order is fixed)."""
    order = sorted((c for c in counts if counts[c]), key=lambda c: (-counts[c], c.value))
    return tuple(
        ReasonGroup(
            cause=c, nodes=counts[c], message=cause_message(c, request), resolvable=c.resolvable
        )
        for c in order
    )


def mig_mode_message(request: PlacementRequest, whole_gpus: int) -> str:
    """A MIG_MODE refusal of one node, with the node's count of GPUs out of MIG mode."""
    return (
        f"{_plural(whole_gpus, 'whole GPU')}, fewer than {_gpus(request)}: the others are"
        " in MIG mode (they take MIG requests, mig_profile)"
    )


def refusal(
    node: str, cause: Cause, request: PlacementRequest, whole_gpus: int | None = None
) -> NodeVerdict:
    """A node's verdict when it cannot take the request; ``whole_gpus`` (the node's GPUs
    out of MIG mode) makes a MIG_MODE refusal say how many the node has."""
    message = cause_message(cause, request)
    if cause is Cause.MIG_MODE and whole_gpus is not None:
        message = mig_mode_message(request, whole_gpus)
    return NodeVerdict(
        node=node,
        fits=False,
        cause=cause,
        message=message,
        resolvable=cause.resolvable,
    )
