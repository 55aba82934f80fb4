"""Words for people: failure messages by cause, and one-line reasons."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from placement.outcome import Cause, NodeVerdict, ReasonGroup
from placement.request import PlacementRequest


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def cause_message(cause: Cause, request: PlacementRequest) -> str:
    k = request.gpus
    gpus = _plural(k, "GPU")
    profile = request.mig_profile or ""
    messages = {
        Cause.NOT_REGISTERED: "no topoplace agent has reported this node",
        Cause.UNAVAILABLE: "node is cordoned or its agent is stale",
        Cause.REGION: f"not in an allowed region ({', '.join(request.regions)})",
        Cause.LABELS: "node labels do not match "
        + ", ".join(f"{key}={val}" for key, val in sorted(request.node_labels.items())),
        Cause.GPU_MODEL: f"fewer than {gpus} of model {' or '.join(request.gpu_models)}",
        Cause.GPU_MEMORY: f"fewer than {gpus} with at least {request.min_gpu_memory_mib} MiB",
        Cause.TOO_FEW_GPUS: f"fewer than {gpus} in total",
        Cause.TOO_FEW_CPUS: f"fewer than {_plural(request.cpus_per_task, 'CPU')} in total",
        Cause.NO_NVLINK_SET_EVER: f"no {gpus} connected by NVLink on this node design",
        Cause.NO_NUMA_SET_EVER: f"no {gpus} on one NUMA node on this node design",
        Cause.NO_MIG_PROFILE: f"no MIG instances of profile {profile}",
        Cause.UNHEALTHY: f"fewer than {gpus} healthy",
        Cause.BUSY: f"fewer than {gpus} free",
        Cause.NO_NVLINK_SET_NOW: f"no NVLink island with {gpus} free",
        Cause.NO_NUMA_SET_NOW: f"no NUMA node with {gpus} free",
        Cause.NO_FREE_MIG: f"no free MIG instance of profile {profile}",
        Cause.CPUS: f"not enough free CPUs near the GPUs ({request.cpus_per_task} per task)",
        Cause.GANG: f"cannot hold {request.tasks} tasks of {gpus} together",
    }
    return messages[cause]


def group_reasons(causes: Iterable[Cause], request: PlacementRequest) -> tuple[ReasonGroup, ...]:
    counts = Counter(causes)
    order = sorted(counts, key=lambda c: (-counts[c], c.value))
    return tuple(
        ReasonGroup(
            cause=c, nodes=counts[c], message=cause_message(c, request), resolvable=c.resolvable
        )
        for c in order
    )


def refusal(node: str, cause: Cause, request: PlacementRequest) -> NodeVerdict:
    """A node's verdict when it cannot take the request."""
    return NodeVerdict(
        node=node,
        fits=False,
        cause=cause,
        message=cause_message(cause, request),
        resolvable=cause.resolvable,
    )
