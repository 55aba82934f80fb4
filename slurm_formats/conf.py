"""Slurm configuration written from node snapshots: gres.conf lines, node lines, features.

- gres.conf: one GRES Type per GPU (``g<index>``), so a job can name exact
  GPUs; ``Links=`` from the NVLink matrix (lanes per peer, -1 for itself);
  ``Cores=`` from the GPU's NUMA node, as Slurm core numbers.
- node lines: CPUs, sockets (one per NUMA node, so ``Cores=`` lines up),
  memory, ``Gres=`` with every per-GPU type, and ``Features`` that let users
  steer by hand (``--constraint``): GPU model, NVLink, largest island,
  multi-node NVLink domain, network block.

Pure functions of the snapshot: the filter derives the same features when a
job asks for some, so what it chooses always satisfies ``--constraint``.
"""

from __future__ import annotations

import hashlib
import re
import uuid

from placement import NodeSnapshot, islands
from placement.cpuset import format_cpuset
from slurm_formats.tres import GPU_TYPE_PREFIX

BLOCK_LABELS = ("topoplace.io/block", "topoplace.io/rack", "topology.kubernetes.io/rack")
_FEATURE_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")


def _feature(text: str) -> str:
    return _FEATURE_UNSAFE.sub("_", text).strip("_").lower()


def gpu_model_token(model: str) -> str:
    """The model's first word made of letters and digits: 'Tesla V100-SXM2-32GB' -> 'v100'."""
    for token in re.split(r"[^A-Za-z0-9]+", model):
        if re.search(r"[A-Za-z]", token) and re.search(r"\d", token):
            return token.lower()
    return _feature(model) or "gpu"


def cluster_token(cluster_uuid: str) -> str:
    """A multi-node NVLink cluster UUID as a feature word, one per cluster: its 32 hex
    digits when NVML's spelling of a UUID, else a hash of it. Its first 8 characters were
    shared by two racks now and then, and a ``--constraint`` naming the one domain let
    Slurm start a job across both; the same hash of any other text keeps "rack-a" and
    "RACK_A", which the engine keeps apart, apart here too."""
    try:
        parsed = uuid.UUID(cluster_uuid)
    except ValueError:
        parsed = None
    if parsed is not None and str(parsed) == cluster_uuid:
        return parsed.hex
    return hashlib.sha256(cluster_uuid.encode("utf-8")).hexdigest()[:32]


def features(snap: NodeSnapshot) -> list[str]:
    """Node features: gpu_<model>, nvlink, nvisland<size of the largest island>,
    nvdomain_<clique> for a multi-node NVLink domain, block_<label value>."""
    out: list[str] = []
    for model in dict.fromkeys(gpu_model_token(g.model) for g in snap.gpus):
        out.append(f"gpu_{model}")
    if snap.gpus:
        # PCIe groups are not NVLink: only NVLink islands give the features.
        largest = max((i.size for i in islands(snap) if i.is_nvlink), default=0)
        if largest > 1:
            out += ["nvlink", f"nvisland{largest}"]
    domain = snap.fabric_domain()
    if domain is not None and snap.fabric is not None:
        cluster = cluster_token(snap.fabric.cluster_uuid)
        out.append(f"nvdomain_{cluster}_{snap.fabric.clique_id}")
    for key in BLOCK_LABELS:
        if key in snap.labels:
            out.append(_feature(f"block_{snap.labels[key]}"))
            break
    return out


def _all_cpus(snap: NodeSnapshot) -> list[int]:
    return sorted({c for numa in snap.numa_nodes for c in snap.numa_cpus(numa.id)})


def _threads_per_core(snap: NodeSnapshot) -> int:
    """2 when every NUMA node holds CPUs c and c + n/2 together (Linux numbers one
    thread of every core first, then the siblings), else 1."""
    cpus = _all_cpus(snap)
    if not cpus or len(cpus) % 2 or cpus != list(range(len(cpus))):
        return 1
    half = len(cpus) // 2
    for numa in snap.numa_nodes:
        own = set(snap.numa_cpus(numa.id))
        if any((c + half in own) != (c < half) for c in own if c < half) or any(
            c - half not in own for c in own if c >= half
        ):
            return 1
    return 2


def _cores_of_numa(snap: NodeSnapshot, numa_id: int) -> list[int]:
    """Slurm core numbers of a NUMA node: first threads only when cores have two."""
    cpus = snap.numa_cpus(numa_id)
    if _threads_per_core(snap) == 2:
        half = len(_all_cpus(snap)) // 2
        return sorted(c for c in cpus if c < half)
    return sorted(cpus)


def links_value(snap: NodeSnapshot, gpu: int) -> str:
    """Slurm ``Links=``: per GPU, -1 for itself, else the NVLink lanes to it (0: none)."""
    values = []
    for other in range(snap.gpu_count):
        if other == gpu:
            values.append("-1")
        else:
            link = snap.link(gpu, other)
            values.append(str(link.lanes if link.is_nvlink else 0))
    return ",".join(values)


def gres_conf_lines(snap: NodeSnapshot, device_dir: str = "/dev") -> list[str]:
    lines = []
    for gpu in snap.gpus:
        parts = [
            f"NodeName={snap.name}",
            "Name=gpu",
            f"Type={GPU_TYPE_PREFIX}{gpu.index}",
            # The device file's number is the minor number: the index names another GPU
            # where the driver's probe order differs from NVML's PCI order.
            f"File={device_dir.rstrip('/')}/nvidia{gpu.device_minor}",
        ]
        if gpu.numa_node is not None:
            cores = _cores_of_numa(snap, gpu.numa_node)
            if cores:
                parts.append(f"Cores={format_cpuset(cores)}")
        parts.append(f"Links={links_value(snap, gpu.index)}")
        lines.append(" ".join(parts))
    return lines


def gres_value(snap: NodeSnapshot) -> str:
    return ",".join(f"gpu:{GPU_TYPE_PREFIX}{g.index}:1" for g in snap.gpus)


def node_conf_line(snap: NodeSnapshot, extra: str = "") -> str:
    cpus = _all_cpus(snap)
    threads = _threads_per_core(snap)
    sockets = max(1, len(snap.numa_nodes))
    parts = [f"NodeName={snap.name}"]
    if cpus:
        cores_per_socket = max(1, len(cpus) // threads // sockets)
        parts += [
            f"CPUs={len(cpus)}",
            f"Sockets={sockets}",
            f"CoresPerSocket={cores_per_socket}",
            f"ThreadsPerCore={threads}",
        ]
    memory = sum(n.memory_mib for n in snap.numa_nodes)
    if memory:
        parts.append(f"RealMemory={memory}")
    if snap.gpus:
        parts.append(f"Gres={gres_value(snap)}")
    feats = features(snap)
    if feats:
        parts.append(f"Features={','.join(feats)}")
    if extra:
        parts.append(extra)
    return " ".join(parts)
