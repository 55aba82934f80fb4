"""What a container gets for its devices: the runtime's way to them, and CUDA/NCCL hints.

Strategies, as NVIDIA's device plugin names them (``--strategy``):

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES`` with the UUIDs, read by the NVIDIA
  container runtime;
- ``cdi-cri``: CDI device names ``nvidia.com/gpu=<UUID>`` in the
  response's ``cdi_devices`` (containerd 1.7+, CRI-O);
- ``cdi-annotations``: the same names in the ``cdi.k8s.io/...`` annotation.

``--device-specs`` adds ``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
``/dev/nvidia-uvm-tools`` and ``/dev/nvidia<N>`` of each GPU, for runtimes
that need the nodes listed: N is the GPU's minor number as NVML gives it
(the driver numbers device files in probe order, NVML orders GPUs by PCI
bus id, so the index names another GPU on some boards), the index only
where the agent read no minor number. A MIG instance adds its parent's
``/dev/nvidia<N>`` and its two capability files,
``/dev/nvidia-caps/nvidia-cap<M>`` (mig_caps.py), all ``rw`` as NVIDIA's
device plugin lists them. ``--driver-root`` prefixes the host side of each
of these paths, never the container's: with NVIDIA's GPU operator the
driver container's device nodes are on the host under its root
(``/run/nvidia/driver/dev/nvidia0``) and the container must still see
``/dev/nvidia0``. Besides, unless switched off, the container gets
``CUDA_VISIBLE_DEVICES`` with the UUIDs in the reservation's order (CUDA
accepts UUIDs, so the order survives the runtime's renumbering), and the
NCCL hints its wiring implies: ``NCCL_P2P_LEVEL=NVL`` when every pair of its
GPUs is on NVLink.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.deviceplugin.mig_caps import MigCaps, cap_path

STRATEGIES = ("envvar", "cdi-cri", "cdi-annotations")
CDI_KIND = "nvidia.com/gpu"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/topoplace-device-plugin_"


@dataclass(frozen=True)
class Wiring:
    """What the plugin knows of the devices handed out."""

    nvlink_connected: bool = False
    allocation_id: str | None = None


@dataclass(frozen=True)
class ContainerOptions:
    strategies: tuple[str, ...] = ("envvar",)
    device_specs: bool = False
    cuda_env: bool = True
    nccl_hints: bool = True
    # Where the driver's /dev is on the host, as an absolute host path: "/" for the host's
    # own driver, /run/nvidia/driver for the GPU operator's driver container.
    driver_root: str = "/"


def host_path(driver_root: str, path: str) -> str:
    """``path`` (a device file as the container sees it, absolute) on the host, under the
    driver root."""
    root = driver_root.rstrip("/")
    return f"{root}{path}"


@dataclass
class ContainerAnswer:
    envs: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    cdi_devices: list[str] = field(default_factory=list)
    device_specs: list[tuple[str, str, str]] = field(default_factory=list)  # path, host, perms


def answer(
    devices: Sequence[str],
    minors: dict[str, int],
    wiring: Wiring,
    options: ContainerOptions,
    caps: Mapping[str, MigCaps] | None = None,
) -> ContainerAnswer:
    """``minors``: each device's GPU device file number; ``caps``: each MIG instance's
    capability files (the caller refuses a MIG instance without them)."""
    out = ContainerAnswer()
    uuids = ",".join(devices)
    names = [f"{CDI_KIND}={d}" for d in devices]
    if "envvar" in options.strategies:
        out.envs["NVIDIA_VISIBLE_DEVICES"] = uuids
    if "cdi-cri" in options.strategies:
        out.cdi_devices = names
    if "cdi-annotations" in options.strategies:
        key = hashlib.sha256(uuids.encode()).hexdigest()[:16]
        out.annotations[CDI_ANNOTATION_PREFIX + key] = ",".join(names)
    if options.device_specs:
        paths = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        paths += [f"/dev/nvidia{m}" for m in sorted({minors[d] for d in devices if d in minors})]
        found = [c for d in devices if (c := (caps or {}).get(d)) is not None]
        cap_minors = {n for c in found for n in (c.gpu_instance, *c.compute_instances)}
        paths += [cap_path(m) for m in sorted(cap_minors)]
        for path in paths:
            out.device_specs.append((path, host_path(options.driver_root, path), "rw"))
    if options.cuda_env:
        out.envs["CUDA_VISIBLE_DEVICES"] = uuids
        out.envs["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if options.nccl_hints and len(devices) > 1 and wiring.nvlink_connected:
        out.envs["NCCL_P2P_LEVEL"] = "NVL"
    if wiring.allocation_id is not None:
        out.envs["TOPOPLACE_ALLOCATION"] = wiring.allocation_id
    return out
