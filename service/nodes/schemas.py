"""API shapes for nodes."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from placement import NodeSnapshot
from placement.snapshot import MAX_GPUS
from placement.text import Text
from service.nodes.nvlink import MAX_LINKS


def _as_utc(value: datetime) -> datetime:
    # SQLite gives back the stored UTC times without their zone; an answer without one
    # is not the RFC 3339 date-time the document promises.
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


UtcTime = Annotated[datetime, AfterValidator(_as_utc)]


class SnapshotReport(BaseModel):
    """What an agent PUTs: its full snapshot and, optionally, its signature over it."""

    # An unknown field is refused, not dropped: a misspelt one was read as left out.
    model_config = ConfigDict(extra="forbid")

    snapshot: NodeSnapshot
    signature: Text | None = Field(
        default=None,
        max_length=512,
        description="the node's Ed25519 signature over the snapshot, standard base64"
        " (docs/agent.md); required once the node has a registered key",
    )


class SnapshotAccepted(BaseModel):
    node: str
    seq: int
    changed: bool = Field(description="false when this snapshot equals the stored one")


class IslandView(BaseModel):
    """An NVLink island (``nvl0``...), or a PCIe group (``pcie0``...) of GPUs without
    NVLink that share a socket's PCIe path."""

    name: str
    gpus: list[int]
    free: list[int]
    kind: Literal["nvlink", "pcie"] = Field(
        default="nvlink", description="nvlink: an NVLink island; pcie: GPUs without NVLink"
    )


class NodeGpuView(BaseModel):
    index: int
    uuid: str
    model: str
    memory_mib: int
    numa_node: int | None
    health: str
    mig_enabled: bool
    free: bool
    island: str = Field(description="the NVLink island (nvl0...) or PCIe group (pcie0...)")
    share_milli: int = Field(
        default=0,
        description="thousandths of this GPU held by GPU shares (gpu_fraction); 0: none. A GPU"
        " holding shares is not free and takes no whole-GPU request",
    )


class NodeView(BaseModel):
    name: str
    region: str
    labels: dict[str, str]
    cpu_isa: str
    gpu_count: int
    free_gpus: list[int]
    gpus: list[NodeGpuView]
    islands: list[IslandView]
    fabric_domain: str | None
    state: str = Field(description="ready, cordoned or stale")
    seq: int
    reported_at: UtcTime
    heartbeat_at: UtcTime
    allocations: list[str] = Field(description="ids of live allocations holding GPUs here")


class NodeList(BaseModel):
    nodes: list[NodeView]


class TopologyView(BaseModel):
    node: str
    gpus: list[str] = Field(description="column and row labels, GPU0..GPUn-1")
    links: list[list[str]]
    bandwidth_gbps: list[list[float]]
    text: str = Field(description="the matrix as nvidia-smi topo -m prints it")


class NodeKeyRegistration(BaseModel):
    """A node's Ed25519 public key, as its agent registers it (docs/agent.md)."""

    # An unknown field is refused, not dropped: a misspelt one was read as left out.
    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["ed25519"] = "ed25519"
    public_key: Text = Field(
        max_length=64,
        json_schema_extra={"pattern": "^[A-Za-z0-9+/]{43}=$"},
        description="the raw 32-byte Ed25519 public key in standard base64",
    )

    @field_validator("public_key")
    @classmethod
    def _raw_ed25519_key(cls, value: str) -> str:
        text = value.strip()
        try:
            raw = base64.b64decode(text, validate=True)
        except binascii.Error:
            raise ValueError("not standard base64") from None
        if len(raw) != 32:
            raise ValueError(f"an Ed25519 public key is 32 bytes, this one is {len(raw)}")
        return text


class NodeKeyView(BaseModel):
    node: str
    algorithm: str
    public_key: str
    registered_at: UtcTime


# An NVML counter is an unsigned 64-bit integer.
Counter64 = Annotated[int, Field(ge=0, le=2**64 - 1)]


class NvlinkCounters(BaseModel):
    """One NVLink's counters as NVML field values give them, since the driver loaded; a
    counter the GPU does not offer is left out (or null)."""

    model_config = {"extra": "forbid"}

    gpu: int = Field(ge=0, lt=MAX_GPUS, description="the GPU's index on the node")
    link: int = Field(ge=0, lt=MAX_LINKS, description="the link's number on that GPU")
    tx_bytes: Counter64 | None = Field(default=None, description="data bytes sent")
    rx_bytes: Counter64 | None = Field(default=None, description="data bytes received")
    crc_flit_errors: Counter64 | None = Field(default=None, description="flow-control CRC errors")
    crc_data_errors: Counter64 | None = Field(default=None, description="data CRC errors")
    replay_errors: Counter64 | None = Field(default=None, description="replays")
    recovery_errors: Counter64 | None = Field(default=None, description="link recoveries")


class HeartbeatReport(BaseModel):
    """What an agent may send with a heartbeat: its NVLink counters (docs/metrics.md)."""

    model_config = {"extra": "forbid"}

    nvlink: list[NvlinkCounters] = Field(
        default_factory=list,
        max_length=MAX_GPUS * MAX_LINKS,
        description="each active link's counters, one entry per (gpu, link)",
    )

    @field_validator("nvlink")
    @classmethod
    def _one_per_link(cls, value: list[NvlinkCounters]) -> list[NvlinkCounters]:
        seen: set[tuple[int, int]] = set()
        for entry in value:
            if (entry.gpu, entry.link) in seen:
                raise ValueError(f"GPU {entry.gpu} link {entry.link} is reported twice")
            seen.add((entry.gpu, entry.link))
        return value


class NvlinkView(BaseModel):
    """A node's latest NVLink counters; ``at`` null and no links before its first report."""

    node: str
    at: UtcTime | None = Field(description="when the service took the reading")
    links: list[NvlinkCounters]
