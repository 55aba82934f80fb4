"""How discovery calls NVML: which errors mean "absent", a lost GPU as its own signal, and
strings NVML answers that a snapshot cannot carry."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

from placement.snapshot import CPU_DEVICE_PREFIX, DEVICE_UUID_PATTERN
from placement.text import forbidden_character

T = TypeVar("T")

_DEVICE_UUID = re.compile(DEVICE_UUID_PATTERN)
UUID_LIMIT = 128  # the longest device UUID a snapshot carries

# Errors that mean "this device has no such feature".
ABSENT = (
    pynvml.NVMLError_NotSupported,
    pynvml.NVMLError_FunctionNotFound,
)
# Past a GPU's last NVLink, NVML answers InvalidArgument.
NO_SUCH_LINK = (*ABSENT, pynvml.NVMLError_InvalidArgument)


class GpuLost(Exception):
    """NVML said GPU is lost: the whole GPU is unhealthy, whatever was being read."""

    def __init__(self, call: str, error: pynvml.NVMLError) -> None:
        super().__init__(f"{error} ({call})")


class Unusable(Exception):
    """NVML answered a string a snapshot cannot carry (empty, too long, control characters,
    not UTF-8): the GPU or MIG device it describes cannot be described."""


def call(name: str, fn: Callable[..., T], *args: Any) -> T:
    """Call one NVML function; a lost GPU becomes ``GpuLost`` naming the call, and an answer
    pynvml cannot decode as UTF-8 becomes ``Unusable``."""
    try:
        return fn(*args)
    except pynvml.NVMLError_GpuIsLost as exc:
        raise GpuLost(name, exc) from None
    except UnicodeDecodeError:
        raise Unusable(f"{name} answered bytes that are not UTF-8") from None


def field_text(name: str, struct: Any, attribute: str, max_length: int) -> str:
    """A string field of an NVML structure, as ``text`` checks it: pynvml decodes the field
    as UTF-8 when it is read, so bytes that are not UTF-8 raise there, not in the call."""
    try:
        value = getattr(struct, attribute)
    except UnicodeDecodeError:
        raise Unusable(f"{name} answered bytes that are not UTF-8") from None
    return text(name, value, max_length)


def text(name: str, value: object, max_length: int) -> str:
    """A string NVML answered, as a snapshot can carry it; ``Unusable`` otherwise.

    Checked here, where the call is known, because a snapshot that fails validation
    later fails the whole round and hides every other GPU of the node.
    """
    if isinstance(value, bytes):  # older nvidia-ml-py versions answer bytes
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise Unusable(f"{name} answered bytes that are not UTF-8") from None
    found = str(value)
    if not found or len(found) > max_length or forbidden_character(found) is not None:
        # repr: the reason lands in health_reason, which carries no control characters.
        raise Unusable(f"{name} answered {found[:40]!r}, which a snapshot cannot carry")
    return found


def device_uuid(name: str, value: object) -> str:
    """A GPU's or MIG device's UUID, as a snapshot and a job's device list can carry it (one
    word of printable ASCII without a comma, not a CPU's name); ``Unusable`` otherwise.

    Checked here, not left to the snapshot's validation: that refuses the whole node.
    """
    found = text(name, value, UUID_LIMIT)
    if not _DEVICE_UUID.match(found) or found.startswith(CPU_DEVICE_PREFIX):
        raise Unusable(f"{name} answered {found[:40]!r}, which no device list can carry")
    return found


def optional(notes: list[str], name: str, fn: Callable[..., T], *args: Any) -> T | None:
    """An optional fact: None when unsupported; None and a note when it fails otherwise."""
    try:
        return call(name, fn, *args)
    except ABSENT:
        return None
    except pynvml.NVMLError as exc:
        notes.append(f"{name}: {exc}")
        return None
