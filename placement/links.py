"""Link labels between two devices, as `nvidia-smi topo -m` names them.

A snapshot stores the GPU-GPU matrix as compact labels so that it reads like
the tool operators already know:

- ``X``      the device itself (diagonal only)
- ``NV<n>``  a bonded set of n NVLink lanes, point to point
- ``NVS<n>`` NVLink through an NVSwitch, n = the smaller of the two GPUs'
             active lane counts (nvidia-smi prints these as ``NV<n>`` too;
             the agent knows the remote end is a switch and keeps that fact)
- ``PIX`` ``PXB`` ``PHB`` ``NODE`` ``SYS``  PCIe levels, nearest first.
  Old drivers print ``SOC`` for ``SYS``; it is read as ``SYS``.

This module only parses and classifies labels; it knows nothing of bandwidth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class LinkKind(StrEnum):
    SELF = "X"
    NVLINK = "NV"
    NVSWITCH = "NVS"
    PIX = "PIX"
    PXB = "PXB"
    PHB = "PHB"
    NODE = "NODE"
    SYS = "SYS"


PCIE_LEVELS: tuple[LinkKind, ...] = (
    LinkKind.PIX,
    LinkKind.PXB,
    LinkKind.PHB,
    LinkKind.NODE,
    LinkKind.SYS,
)

_NV_RE = re.compile(r"^(NVS?)(\d{1,3})$")
_ALIASES = {"SOC": LinkKind.SYS}


class LinkLabelError(ValueError):
    """A string that is not a link label nvidia-smi could have printed."""


@dataclass(frozen=True, slots=True)
class Link:
    kind: LinkKind
    lanes: int = 0

    @property
    def is_nvlink(self) -> bool:
        return self.kind in (LinkKind.NVLINK, LinkKind.NVSWITCH)

    @property
    def label(self) -> str:
        if self.is_nvlink:
            return f"{self.kind.value}{self.lanes}"
        return self.kind.value


def parse_link(text: str) -> Link:
    """Parse one cell of the link matrix; raises LinkLabelError on anything else."""
    label = text.strip().upper()
    if label in _ALIASES:
        return Link(_ALIASES[label])
    match = _NV_RE.match(label)
    if match:
        lanes = int(match.group(2))
        if lanes < 1:
            raise LinkLabelError(f"NVLink label {text!r} has no lanes")
        kind = LinkKind.NVSWITCH if match.group(1) == "NVS" else LinkKind.NVLINK
        return Link(kind, lanes)
    try:
        kind = LinkKind(label)
    except ValueError:
        known = "X, NV<n>, NVS<n>, PIX, PXB, PHB, NODE, SYS, SOC"
        raise LinkLabelError(f"unknown link label {text!r} (known: {known})") from None
    if kind in (LinkKind.NVLINK, LinkKind.NVSWITCH):
        raise LinkLabelError(f"NVLink label {text!r} needs a lane count, e.g. NV4")
    return Link(kind)
