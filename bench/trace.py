"""The Alibaba GPU cluster trace (2023, "openb") as snapshots and requests.

The trace gives, per node, only the GPU count and an (anonymised) model name,
and per pod the GPUs it asks for; it says nothing about the wiring inside a
node. The wiring therefore comes from the built-in profiles, by one fixed,
documented mapping (``profile_for``):

- 8-GPU nodes (G2, G3, V100M16, V100M32): ``dgx1-v100``, the NVLink hybrid
  cube-mesh. V100M16/V100M32 are SXM2 V100s, which shipped in that layout;
  G2/G3 are anonymised models of the same fleet and are given the same
  wiring rather than guessed at, so every 8-GPU box has NVLink.
- V100 (and G2/G3) nodes with fewer GPUs: the first k GPUs of ``dgx1-v100``
  (GPUs 0-3 of a DGX-1 are fully NVLink-connected, one NUMA node).
- T4, P100, A10 and any other model: the first k GPUs of ``pcie-8x-l40s``,
  i.e. PCIe only (``NODE`` within a socket). These cards are PCIe cards in
  the trace's fleet.

GPU model names stay those of the trace (``Gpu.model``), so ``gpu_spec``
constraints match them; the memory size is set where the name tells it.
Nodes with more than 8 GPUs do not occur in the trace and are refused.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from placement.profiles import build_profile
from placement.snapshot import Gpu, Nic, NodeSnapshot

DEFAULT_TRACE_DIR = Path("/work/shared/data/alibaba-gpu-v2023")
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILES = {
    "default": "openb_pod_list_default.csv",
    "multigpu50": "openb_pod_list_multigpu50.csv",
}

# Trace models that get the DGX-1 NVLink wiring; everything else is PCIe-only.
NVLINK_MODELS = frozenset({"G2", "G3", "V100M16", "V100M32"})
# Memory per GPU where the anonymised name tells it; otherwise the profile's.
MODEL_MEMORY_MIB = {
    "V100M16": 16384,
    "V100M32": 32768,
    "P100": 16384,
    "T4": 15360,
    "A10": 24576,
}
MAX_GPUS = 8


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class Pod:
    name: str
    gpus: int
    gpu_models: tuple[str, ...]  # from gpu_spec; empty = any model


@dataclass(frozen=True, slots=True)
class PodList:
    pods: tuple[Pod, ...]  # whole-GPU pods, in file order
    total: int  # rows read (after ``limit``)
    cpu_only: int  # num_gpu == 0: not GPU placement
    sharing: int  # gpu_milli < 1000: GPU sharing, out of scope


def profile_for(gpus: int, model: str) -> str:
    """The built-in profile whose first ``gpus`` GPUs model a trace node."""
    if gpus < 1 or gpus > MAX_GPUS:
        raise ValueError(f"trace nodes have 1..{MAX_GPUS} GPUs, not {gpus}")
    return "dgx1-v100" if model.upper() in NVLINK_MODELS else "pcie-8x-l40s"


def slice_snapshot(snapshot: NodeSnapshot, k: int, model: str | None = None) -> NodeSnapshot:
    """The node made of the first ``k`` GPUs of ``snapshot``, with their links.

    NUMA nodes no kept GPU sits on are dropped; NICs keep their relations to
    the kept GPUs. ``model`` renames every GPU (and sets its memory where the
    name tells it).
    """
    if k < 1 or k > snapshot.gpu_count:
        raise ValueError(f"cannot take {k} GPUs of a {snapshot.gpu_count}-GPU node")
    memory = MODEL_MEMORY_MIB.get(model.upper()) if model else None
    gpus: list[Gpu] = []
    for gpu in snapshot.gpus[:k]:
        update: dict[str, object] = {}
        if model:
            update["model"] = model
        if memory is not None:
            update["memory_mib"] = memory
        gpus.append(Gpu.model_validate({**gpu.model_dump(), **update}))
    numa_ids = {g.numa_node for g in gpus if g.numa_node is not None}
    return NodeSnapshot.model_validate(
        {
            **snapshot.model_dump(),
            "gpus": [g.model_dump() for g in gpus],
            "links": [row[:k] for row in snapshot.links[:k]],
            "numa_nodes": [n.model_dump() for n in snapshot.numa_nodes if n.id in numa_ids],
            "nics": [Nic(name=nic.name, links=nic.links[:k]).model_dump() for nic in snapshot.nics],
            "cpu_links": [c.model_dump() for c in snapshot.cpu_links if c.gpu < k],
            "mig_instances": [m.model_dump() for m in snapshot.mig_instances if m.parent_gpu < k],
        }
    )


def node_snapshot(node: TraceNode) -> NodeSnapshot:
    """The snapshot of one trace node under the mapping of ``profile_for``."""
    base = build_profile(profile_for(node.gpus, node.model), node.name)
    return slice_snapshot(base, node.gpus, node.model)


def read_nodes(trace_dir: Path = DEFAULT_TRACE_DIR) -> list[TraceNode]:
    """GPU nodes of the trace, in file order."""
    with (trace_dir / NODE_FILE).open(newline="") as fh:
        return [
            TraceNode(name=row["sn"], gpus=int(row["gpu"]), model=row["model"].strip())
            for row in csv.DictReader(fh)
            if int(row["gpu"]) > 0
        ]


def build_cluster(nodes: Iterable[TraceNode]) -> list[NodeSnapshot]:
    """Snapshots for the trace nodes, in the order given."""
    return [node_snapshot(node) for node in nodes]


def read_pods(
    name: str = "default", trace_dir: Path = DEFAULT_TRACE_DIR, limit: int | None = None
) -> PodList:
    """Whole-GPU pods of a pod list (``default``, ``multigpu50`` or a file name), in order.

    Pods asking for no GPU, or for a share of one (``gpu_milli`` < 1000), are
    counted and left out: whole-GPU placement is what the engine decides.
    ``limit`` reads only the first ``limit`` rows.
    """
    path = trace_dir / POD_FILES.get(name, name)
    pods: list[Pod] = []
    total = cpu_only = sharing = 0
    with path.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if limit is not None and total >= limit:
                break
            total += 1
            num_gpu = int(row["num_gpu"])
            if num_gpu < 1:
                cpu_only += 1
                continue
            if int(row["gpu_milli"]) < 1000:
                sharing += 1
                continue
            spec = (row.get("gpu_spec") or "").strip()
            models = tuple(m.strip() for m in spec.split("|") if m.strip())
            pods.append(Pod(name=row["name"], gpus=num_gpu, gpu_models=models))
    return PodList(pods=tuple(pods), total=total, cpu_only=cpu_only, sharing=sharing)
