"""The bandwidth model: link labels to GB/s, per pair of GPUs, one direction.

Defaults (documented in docs/engine.md, overridable in settings):

- ``NV<n>`` / ``NVS<n>``: n lanes x the per-lane rate of the GPU family
  (Pascal 20; Volta, Ampere, Hopper 25; Blackwell 50; anything else 25).
  When the two GPUs differ, the slower family's rate counts.
- PCIe: ``PIX`` 24, ``PXB`` 20, ``PHB`` 16, ``NODE`` 12, ``SYS`` 8.
- Between nodes: GPUs of one multi-node NVLink domain talk at NVLink speed
  (their nodes' best NVLink pair rate); otherwise over the network, at
  ``network_gbps`` inside one network block and ``cross_block_gbps`` across.

The numbers are what the ranking needs, not a promise of measured
throughput: they order choices correctly, and they make the reported
"predicted ring bandwidth" comparable between nodes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, field_validator

from placement.gpu_family import gpu_family
from placement.links import PCIE_LEVELS, LinkKind
from placement.snapshot import NodeSnapshot

_DEFAULT_LANE_GBPS: dict[str, float] = {
    "pascal": 20.0,
    "volta": 25.0,
    "turing": 25.0,
    "ampere": 25.0,
    "ada": 25.0,
    "hopper": 25.0,
    "blackwell": 50.0,
    "unknown": 25.0,
}
_DEFAULT_PCIE_GBPS: dict[str, float] = {
    "PIX": 24.0,
    "PXB": 20.0,
    "PHB": 16.0,
    "NODE": 12.0,
    "SYS": 8.0,
}


class BandwidthTable(BaseModel):
    """Per-link-kind bandwidth in GB/s (one direction). Immutable; hashable by value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nvlink_lane_gbps: dict[str, float] = Field(default_factory=lambda: dict(_DEFAULT_LANE_GBPS))
    pcie_gbps: dict[str, float] = Field(default_factory=lambda: dict(_DEFAULT_PCIE_GBPS))
    network_gbps: float = Field(default=25.0, gt=0)
    cross_block_gbps: float = Field(default=12.5, gt=0)

    @field_validator("nvlink_lane_gbps")
    @classmethod
    def _lanes(cls, value: dict[str, float]) -> dict[str, float]:
        merged = {**_DEFAULT_LANE_GBPS, **{k.lower(): v for k, v in value.items()}}
        for family, rate in merged.items():
            if rate <= 0:
                raise ValueError(f"nvlink_lane_gbps[{family}] must be positive, got {rate}")
        return merged

    @field_validator("pcie_gbps")
    @classmethod
    def _pcie(cls, value: dict[str, float]) -> dict[str, float]:
        merged = dict(_DEFAULT_PCIE_GBPS)
        for key, rate in value.items():
            level = "SYS" if key.upper() == "SOC" else key.upper()
            if level not in _DEFAULT_PCIE_GBPS:
                raise ValueError(
                    f"pcie_gbps: unknown PCIe level {key!r} (PIX, PXB, PHB, NODE, SYS)"
                )
            if rate <= 0:
                raise ValueError(f"pcie_gbps[{level}] must be positive, got {rate}")
            merged[level] = rate
        return merged

    def lane_rate(self, model_a: str, model_b: str) -> float:
        rate_a = self.nvlink_lane_gbps.get(gpu_family(model_a), self.nvlink_lane_gbps["unknown"])
        rate_b = self.nvlink_lane_gbps.get(gpu_family(model_b), self.nvlink_lane_gbps["unknown"])
        return min(rate_a, rate_b)

    def cache_key(self) -> tuple[tuple[str, float], ...]:
        return tuple(sorted(self.nvlink_lane_gbps.items())) + tuple(sorted(self.pcie_gbps.items()))


DEFAULT_BANDWIDTH = BandwidthTable()


def bandwidth_matrix(
    snapshot: NodeSnapshot, table: BandwidthTable = DEFAULT_BANDWIDTH
) -> NDArray[np.float64]:
    """n x n GB/s between every pair of the node's GPUs; 0 on the diagonal."""
    n = snapshot.gpu_count
    out = np.zeros((n, n), dtype=np.float64)
    for i in range(n):
        for j in range(i + 1, n):
            link = snapshot.link(i, j)
            if link.is_nvlink:
                value = link.lanes * table.lane_rate(snapshot.gpus[i].model, snapshot.gpus[j].model)
            elif link.kind in PCIE_LEVELS:
                value = table.pcie_gbps[link.kind.value]
            else:  # pragma: no cover - validation forbids X off the diagonal
                raise AssertionError(f"unexpected link {link} off the diagonal")
            out[i, j] = out[j, i] = value
    return out


def nvlink_adjacency(snapshot: NodeSnapshot) -> NDArray[np.bool_]:
    """n x n: True where two GPUs share NVLink (direct or through an NVSwitch)."""
    n = snapshot.gpu_count
    out = np.zeros((n, n), dtype=np.bool_)
    for i in range(n):
        for j in range(n):
            if i != j and snapshot.link(i, j).kind in (LinkKind.NVLINK, LinkKind.NVSWITCH):
                out[i, j] = True
    return out
