"""The capability device files a MIG instance is opened through.

A process reaches a MIG instance through its parent GPU's ``/dev/nvidia<N>``
and two capability files, ``/dev/nvidia-caps/nvidia-cap<M>``: one guarding
the GPU instance, one the compute instance. Without them CUDA in the
container finds no device. The driver lists each file's M in
``/proc/driver/nvidia-caps/mig-minors``, one capability a line::

    gpu0/gi1/access 12
    gpu0/gi1/ci0/access 13

A GPU instance split into several compute instances has a line for each; a
container given the instance gets all of them.

``gpu<N>`` is the parent GPU's minor number (not its index), ``gi``/``ci``
NVML's GPU and compute instance ids, which only the NVML source reads
(``agent/nvml_mig.py``). NVIDIA's device plugin lists the same three files.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.nvml_mig import MigIds
from placement.snapshot import NodeSnapshot

log = logging.getLogger("topoplace.deviceplugin")

MIG_MINORS = Path("/proc/driver/nvidia-caps/mig-minors")
CAPS_DIR = "/dev/nvidia-caps"


@dataclass(frozen=True)
class MigCaps:
    """The minors of a MIG instance's capability files: its GPU instance's, and each of
    its compute instances' (one unless the GPU instance is split), its own first."""

    gpu_instance: int
    compute_instances: tuple[int, ...]


def cap_path(minor: int) -> str:
    return f"{CAPS_DIR}/nvidia-cap{minor}"


def read_mig_minors(path: Path) -> dict[str, int]:
    """Capability name (``gpu0/gi1/ci0/access``) -> minor. Empty when the file is absent
    (a driver without MIG) or unreadable (logged); lines of another form are skipped."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        log.warning("cannot read %s: %s", path, exc.strerror or exc)
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def mig_caps(
    snapshot: NodeSnapshot, ids: Mapping[str, MigIds], minors: Mapping[str, int], source: Path
) -> dict[str, MigCaps | str]:
    """Each MIG instance's UUID -> its capability minors, or why they cannot be found
    (``source``: where ``minors`` were read, for the message)."""
    parents = {g.index: g for g in snapshot.gpus}
    out: dict[str, MigCaps | str] = {}
    for m in snapshot.mig_instances:
        parent = parents.get(m.parent_gpu)
        found = ids.get(m.uuid)
        if parent is None or parent.minor_number is None:
            # The file names GPUs by minor number; the index may be another GPU's.
            out[m.uuid] = f"no minor number is known for its GPU {m.parent_gpu}"
            continue
        if found is None:
            out[m.uuid] = "its GPU and compute instance ids are unknown (only NVML gives them)"
            continue
        gi = f"gpu{parent.minor_number}/gi{found.gpu_instance}"
        gi_name = f"{gi}/access"
        ci_names = [f"{gi}/ci{ci}/access" for ci in found.compute_instances]
        missing = [n for n in (gi_name, *ci_names) if n not in minors]
        if missing:
            out[m.uuid] = f"{source} has no line {' or '.join(missing)}"
            continue
        out[m.uuid] = MigCaps(minors[gi_name], tuple(minors[n] for n in ci_names))
    return out
