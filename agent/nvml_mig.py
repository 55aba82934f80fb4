"""A MIG-enabled GPU's instances, read through its MIG device handles.

Each MIG device names its GPU instance; the instance gives its profile id
and placement (start and size in memory slices), and the GPU's profile table
maps the id to the name NVML prints (``MIG 1g.10gb``). A GPU instance split
into several compute instances appears once: the engine places whole GPU
instances.
"""

from __future__ import annotations

from typing import Any

import pynvml  # type: ignore[import-untyped]
from pydantic import ValidationError

from agent.nvml_api import Nvml
from agent.nvml_calls import GpuLost, call
from placement.snapshot import MigInstance
from placement.text import forbidden_character


def read_migs(nvml: Nvml, parent: Any, gpu_index: int, notes: list[str]) -> list[MigInstance]:
    """The GPU's instances by placement; a device that cannot be read is left out and noted."""
    names = _profile_names(nvml, parent)
    try:
        count = call("nvmlDeviceGetMaxMigDeviceCount", nvml.nvmlDeviceGetMaxMigDeviceCount, parent)
    except pynvml.NVMLError as exc:
        # No instances is safe (a MIG GPU serves only through them); a raise here would
        # fail the whole round and hide the node's other GPUs.
        notes.append(f"MIG devices unreadable: {exc}")
        return []
    found: dict[int, MigInstance] = {}
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
                continue  # another compute instance of a GPU instance already read
            info = nvml.nvmlGpuInstanceGetInfo(
                nvml.nvmlDeviceGetGpuInstanceById(parent, instance_id)
            )
            found[instance_id] = MigInstance(
                uuid=str(nvml.nvmlDeviceGetUUID(mig)),
                parent_gpu=gpu_index,
                profile=names.get(int(info.profileId)) or _profile_from_name(nvml, mig),
                placement_start=int(info.placement.start),
                placement_size=int(info.placement.size),
            )
        except pynvml.NVMLError_GpuIsLost as exc:
            raise GpuLost("MIG device", exc) from None
        except (pynvml.NVMLError, ValueError) as exc:
            # ValueError: an answer the instance cannot carry (an odd UUID or profile name,
            # bytes that are not UTF-8); one device left out, not the node's round failed.
            notes.append(f"MIG device {slot}: {_short(exc)}")
    return sorted(found.values(), key=lambda m: m.placement_start)


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
