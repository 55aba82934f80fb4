"""A MIG-enabled GPU's instances, read through its MIG device handles.

Each MIG device names its GPU instance; the instance gives its profile id
and placement (start and size in memory slices), and the GPU's profile table
maps the id to the name NVML prints (``MIG 1g.10gb``). A GPU instance split
into several compute instances appears once, as the first of its MIG devices
read: the engine places whole GPU instances.

Each instance also keeps its GPU instance id and the compute instance id of
each of its MIG devices (``MigIds``), its own first: the device plugin finds
the capability device files (``/dev/nvidia-caps/nvidia-cap<N>``) a container
given the whole GPU instance needs by them. They stay in the agent, not in
the snapshot: nothing the service decides depends on them.

Instances whose placements overlap (or run past the GPU's slices) are not
something a GPU can hold: the driver's answer is wrong, and which instance
is real is unknown, so the GPU's whole MIG list is refused (left out, the
error logged and noted) rather than the node's snapshot, which the service
would refuse, and with it every other GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pynvml  # type: ignore[import-untyped]
from pydantic import ValidationError

from agent.nvml_api import Nvml
from agent.nvml_calls import GpuLost, Unusable, call, device_uuid
from placement.snapshot import MAX_MIG_SLICES, MigInstance
from placement.text import forbidden_character

log = logging.getLogger("topoplace.agent")


@dataclass(frozen=True)
class MigIds:
    """Which GPU instance of its GPU a MIG instance is, and the compute instances it is
    split into (NVML's ids): the instance's own MIG device's first, then the others'."""

    gpu_instance: int
    compute_instances: tuple[int, ...]


def read_migs(
    nvml: Nvml,
    parent: Any,
    gpu_index: int,
    notes: list[str],
    ids: dict[str, MigIds] | None = None,
) -> list[MigInstance]:
    """The GPU's instances by placement; a device that cannot be read is left out and noted.
    ``ids`` gets each instance's ``MigIds`` by UUID, where NVML gives the compute instance's."""
    names = _profile_names(nvml, parent)
    try:
        count = call("nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount, parent)
    except pynvml.NVMLError as exc:
        # No instances is safe (a MIG GPU serves only through them); a raise here would
        # fail the whole round and hide the node's other GPUs.
        notes.append(f"MIG devices unreadable: {exc}")
        return []
    found: dict[int, MigInstance] = {}
    # GPU instance id -> the compute instance ids of its MIG devices, in the order read;
    # None where the instance's own (the first read) is unknown: then no ids at all.
    computes: dict[int, list[int] | None] = {}
    for slot in range(count):
        try:
            mig = call(
                "nvmlDeviceGetMigDeviceHandleByIndex",
                nvml.nvmlDeviceGetMigDeviceHandleByIndex,
                parent,
                slot,
            )
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot
        except pynvml.NVMLError as exc:
            notes.append(f"MIG device {slot}: {exc}")
            continue
        try:
            instance_id = nvml.nvmlDeviceGetGpuInstanceId(mig)
            if instance_id in found:
                # Another compute instance of a GPU instance already read: not placed
                # alone, but a container given the instance needs its capability file.
                compute = _compute_instance(nvml, mig, notes, slot)
                known = computes.get(instance_id)
                if known is not None and compute is not None and compute not in known:
                    known.append(compute)
                continue
            info = nvml.nvmlGpuInstanceGetInfo(
                nvml.nvmlDeviceGetGpuInstanceById(parent, instance_id)
            )
            found[instance_id] = MigInstance(
                uuid=device_uuid("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID(mig)),
                parent_gpu=gpu_index,
                profile=names.get(int(info.profileId)) or _profile_from_name(nvml, mig),
                placement_start=int(info.placement.start),
                placement_size=int(info.placement.size),
            )
            compute = _compute_instance(nvml, mig, notes, slot)
            computes[instance_id] = None if compute is None else [compute]
        except pynvml.NVMLError_GpuIsLost as exc:
            raise GpuLost("MIG device", exc) from None
        except (pynvml.NVMLError, ValueError, Unusable) as exc:
            # ValueError, Unusable: an answer the instance or a job's device list cannot
            # carry (an odd UUID or profile name, bytes that are not UTF-8); one device
            # left out, not the node's round failed.
            notes.append(f"MIG device {slot}: {_short(exc)}")
    instances = sorted(found.values(), key=lambda m: m.placement_start)
    problem = _misplaced(instances)
    if problem is not None:
        log.error("GPU %d: %s", gpu_index, problem)
        notes.append(problem)
        return []
    if ids is not None:
        for instance_id, mig in found.items():
            own = computes.get(instance_id)
            if own is not None:
                ids[mig.uuid] = MigIds(int(instance_id), tuple(own))
    return instances


def _compute_instance(nvml: Nvml, mig: Any, notes: list[str], slot: int) -> int | None:
    """The MIG device's compute instance id; None (noted) when NVML cannot say: the
    instance is still placed, only its capability files cannot be found."""
    try:
        return int(nvml.nvmlDeviceGetComputeInstanceId(mig))
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        notes.append(f"MIG device {slot}: compute instance id unreadable: {exc}")
        return None


def _slices(mig: MigInstance) -> str:
    return f"slices {mig.placement_start}..{mig.placement_start + mig.placement_size - 1}"


def _misplaced(instances: list[MigInstance]) -> str | None:
    """Why instances sorted by start cannot all be on one GPU, or None when they can."""
    widest: MigInstance | None = None  # the instance reaching furthest so far
    for mig in instances:
        end = mig.placement_start + mig.placement_size
        if end > MAX_MIG_SLICES:
            return (
                f"MIG instance {mig.uuid} ({_slices(mig)}) runs past slice"
                f" {MAX_MIG_SLICES - 1}: the GPU's MIG instances are left out"
            )
        reached = 0 if widest is None else widest.placement_start + widest.placement_size
        if widest is not None and mig.placement_start < reached:
            return (
                f"MIG instances {widest.uuid} ({_slices(widest)}) and {mig.uuid}"
                f" ({_slices(mig)}) overlap: the GPU's MIG instances are left out"
            )
        if end > reached:
            widest = mig
    return None


def _short(exc: Exception) -> str:
    """The error on one line (a validation error spans several), control characters escaped."""
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        said = f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
    else:
        said = str(exc) or type(exc).__name__
    return said if forbidden_character(said) is None else repr(said)


def _profile_names(nvml: Nvml, parent: Any) -> dict[int, str]:
    """GPU instance profile id -> name (``1g.10gb``) for the profiles this GPU offers."""
    names: dict[int, str] = {}
    for profile in range(pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(parent, profile)
            name = str(info.name).strip()
        except pynvml.NVMLError:
            continue  # not offered by this GPU
        except UnicodeDecodeError:
            continue  # a name pynvml cannot decode: the MIG device's own name is used
        names[int(info.id)] = name.split()[-1].lower() if name else ""
    return names


def _profile_from_name(nvml: Nvml, mig: Any) -> str:
    # "NVIDIA A100-SXM4-80GB MIG 1g.10gb": the profile is the last word.
    return str(nvml.nvmlDeviceGetName(mig)).split()[-1].lower()
