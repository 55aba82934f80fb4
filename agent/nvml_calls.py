"""How discovery calls NVML: which errors mean "absent", and a lost GPU as its own signal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]

T = TypeVar("T")

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


def call(name: str, fn: Callable[..., T], *args: Any) -> T:
    """Call one NVML function; a lost GPU becomes ``GpuLost`` naming the call."""
    try:
        return fn(*args)
    except pynvml.NVMLError_GpuIsLost as exc:
        raise GpuLost(name, exc) from None


def optional(notes: list[str], name: str, fn: Callable[..., T], *args: Any) -> T | None:
    """An optional fact: None when unsupported; None and a note when it fails otherwise."""
    try:
        return call(name, fn, *args)
    except ABSENT:
        return None
    except pynvml.NVMLError as exc:
        notes.append(f"{name}: {exc}")
        return None
