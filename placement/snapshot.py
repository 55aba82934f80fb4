"""What a node reports: the node snapshot model.

A snapshot is everything the engine needs to know about one machine: its
GPUs, how they are wired to each other and to the CPUs and NICs, their MIG
instances, the multi-node NVLink fabric they belong to, and health. Agents
build snapshots; the service stores them; the engine reads them. Snapshots
are immutable values, validated on construction: an inconsistent snapshot
(asymmetric link matrix, unknown link label, duplicate UUID, a matrix whose
size does not match the GPU list) is refused with an error whose location
names the offending field, e.g. ``links.2.5``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from placement.cpuset import CpusetError, cpuset_spans, format_cpuset, parse_cpuset
from placement.links import Link, LinkKind, LinkLabelError, parse_link
from placement.numbers import WHOLE
from placement.text import Text

CpuIsa = Literal["x86_64", "aarch64", "riscv64"]
FabricState = Literal["not_supported", "not_started", "in_progress", "completed"]
CpuLinkKind = Literal["nvlink-c2c", "nvlink-fusion", "pcie"]

# Kubernetes label syntax: an optional DNS-subdomain prefix, a name of at most
# 63 characters, and a value of at most 63 characters (may be empty). Slurm
# features and Kubernetes node labels are both derived from these, so they
# must be valid in both worlds.
_LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE_RE = re.compile(rf"^({_LABEL_NAME})?$")
NODE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_NODE_NAME_RE = re.compile(NODE_NAME_PATTERN)
_MIG_PROFILE_RE = re.compile(r"^(\d+c\.)?\d+g\.\d+gb(\+[a-z0-9.]+)?$")

# Numbers are strict (JSON true or "4" is refused) and bounded: every count and size
# fits a 32-bit column, and seq a signed 64-bit one (the database's BigInteger).
NonNegInt = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1), WHOLE]
# A seq is stored as a signed 64-bit integer (BIGINT); a larger one could never be stored.
MAX_SEQ = 2**63 - 1
Seq = Annotated[int, Field(strict=True, ge=0, le=MAX_SEQ), WHOLE]
# A MIG GPU's slices: 8 on every MIG GPU so far, 64 allowed. The engine lists a GPU's
# slices up to its last instance's end on every MIG placement, so the end is bounded.
MAX_MIG_SLICES = 64
SliceCount = Annotated[int, Field(strict=True, ge=1, le=MAX_MIG_SLICES), WHOLE]
SliceStart = Annotated[int, Field(strict=True, ge=0, le=MAX_MIG_SLICES - 1), WHOLE]
Flag = Annotated[bool, Field(strict=True)]
# Linux builds for at most 8,192 CPUs (x86 MAXSMP); a cpuset naming CPU ids far past
# that is not a machine but a request to expand a range of billions of numbers.
MAX_CPU_ID = 16_383
# And a node's NUMA nodes together name at most this many CPUs, each in one node only:
# each cpuset was bounded alone, so 1,024 nodes of "0-16383" (32 KB) made 16.7 million.
MAX_CPUS = MAX_CPU_ID + 1
MAX_CPUSET_CHARS = 131_072
MAX_GPUS = 63
# Far more NICs than a machine carries; the topology view prints a NIC x NIC matrix,
# so 3,000 NICs made 35 MB of text.
MAX_NICS = 1024
# Node labels, copied into Slurm features and Kubernetes node labels; an operator sets
# a handful.
MAX_LABELS = 256
# A device UUID is printable ASCII without spaces or commas. UUIDs are joined with commas
# into CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES and the Kubernetes device
# annotations: a GPU reported as "GPU-a,GPU-b" would show GPU-b to whichever job is given
# it. NVML's are "GPU-<uuid>", "MIG-<uuid>" and, before R470, "MIG-GPU-<uuid>/<gi>/<ci>".
DEVICE_UUID_PATTERN = r"^[\x21-\x2b\x2d-\x7e]+$"
_DEVICE_UUID_RE = re.compile(DEVICE_UUID_PATTERN)
DeviceUuid = Annotated[
    Text,
    Field(min_length=1, max_length=128, json_schema_extra={"pattern": DEVICE_UUID_PATTERN}),
]
# Held CPUs are stored beside held GPU and MIG UUIDs, named "cpu:<id>" (the service's
# gpu_holds.device): a device UUID spelled so would be read back as a CPU.
CPU_DEVICE_PREFIX = "cpu:"


# A link label ("NVS18", "NODE"): a refusal quotes an unknown one, so a matrix of long
# ones came back as large as it was sent.
LinkLabel = Annotated[Text, Field(max_length=16)]


class Health(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NumaNode(_Frozen):
    id: NonNegInt
    # Room for all 16,384 CPUs listed one by one (87 KB); "0,0,0,..." over 4 MB made two
    # million ranges to sort.
    cpus: Text = Field(
        max_length=MAX_CPUSET_CHARS,
        description="Linux cpuset of the node's CPUs, e.g. '0-47,96-143'",
    )
    memory_mib: NonNegInt = 0

    @field_validator("cpus")
    @classmethod
    def _valid_cpuset(cls, value: str) -> str:
        # Read as ranges, never expanded here: the snapshot counts and compares its
        # nodes' ranges before anything expands them (_check_numa).
        for number in re.findall(r"[0-9]+", value):
            if len(number) > 5 or int(number) > MAX_CPU_ID:
                raise ValueError(
                    f"CPU {number[:12]} is past the highest CPU id Linux uses ({MAX_CPU_ID})"
                )
        try:
            spans = cpuset_spans(value)
        except CpusetError as exc:
            raise ValueError(str(exc)) from None
        if spans and spans[-1][1] > MAX_CPU_ID:
            raise ValueError(f"CPU {spans[-1][1]} is past the highest CPU id Linux uses")
        return value.strip()

    @cached_property
    def cpu_spans(self) -> tuple[tuple[int, int], ...]:
        return cpuset_spans(self.cpus)

    @cached_property
    def cpu_list(self) -> tuple[int, ...]:
        return parse_cpuset(self.cpus)


class Gpu(_Frozen):
    index: NonNegInt
    uuid: DeviceUuid
    model: Text = Field(min_length=1, max_length=128)
    memory_mib: NonNegInt = 0
    pci_bus_id: Text = Field(default="", max_length=64)
    numa_node: NonNegInt | None = None
    health: Health = Health.HEALTHY
    health_reason: Text = Field(default="", max_length=1024)
    mig_enabled: Flag = False
    # The driver numbers /dev/nvidia<N> in probe order, NVML indexes by PCI bus id: the
    # two differ on some boards, and a device file named by index is another GPU. Left
    # out of the JSON when unknown, so a snapshot of an agent that never sent it reads
    # (and verifies against its signature) as it was sent.
    minor_number: NonNegInt | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="the N of the GPU's /dev/nvidiaN (NVML's minor number); unknown: null",
    )

    @property
    def device_minor(self) -> int:
        """The N of the GPU's /dev/nvidiaN: its minor number, else (unknown) its index."""
        return self.index if self.minor_number is None else self.minor_number


class MigInstance(_Frozen):
    uuid: DeviceUuid
    parent_gpu: NonNegInt
    profile: Text = Field(
        max_length=64, description="MIG profile name, e.g. '1g.10gb' or '3g.40gb'"
    )
    placement_start: SliceStart
    placement_size: SliceCount
    health: Health = Health.HEALTHY

    @field_validator("profile")
    @classmethod
    def _valid_profile(cls, value: str) -> str:
        profile = value.strip().lower()
        if not _MIG_PROFILE_RE.match(profile):
            raise ValueError(f"{value!r} is not a MIG profile name such as '1g.10gb' or '3g.40gb'")
        return profile


class Nic(_Frozen):
    name: Text = Field(min_length=1, max_length=64)
    links: list[LinkLabel] = Field(
        description="PCIe relation to each GPU, by GPU index (PIX, PXB, ...)"
    )

    @field_validator("links")
    @classmethod
    def _valid_labels(cls, value: list[str]) -> list[str]:
        out = []
        for i, label in enumerate(value):
            try:
                link = parse_link(label)
            except LinkLabelError as exc:
                raise ValueError(f"links[{i}]: {exc}") from None
            out.append(link.label)
        return out


class CpuLink(_Frozen):
    """A GPU's own link to the host CPU, when it is not plain PCIe."""

    gpu: NonNegInt
    kind: CpuLinkKind
    lanes: NonNegInt | None = None
    bandwidth_gbps: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class Fabric(_Frozen):
    """The multi-node NVLink domain this node's GPUs belong to (NVML GPU fabric info)."""

    cluster_uuid: Text = Field(min_length=1, max_length=64)
    clique_id: NonNegInt
    state: FabricState = "completed"
    healthy: Flag = True

    @property
    def usable(self) -> bool:
        # NVML only vouches for the identity once registration completed.
        return self.state == "completed" and self.healthy

    @property
    def domain(self) -> str:
        return f"{self.cluster_uuid}/{self.clique_id}"


class NodeSnapshot(_Frozen):
    name: str = Field(
        min_length=1, max_length=253, json_schema_extra={"pattern": _NODE_NAME_RE.pattern}
    )
    region: Text = Field(default="default", min_length=1, max_length=63)
    labels: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        json_schema_extra={
            "propertyNames": {"pattern": _LABEL_KEY_RE.pattern},
            "additionalProperties": {"type": "string", "pattern": _LABEL_VALUE_RE.pattern},
        },
    )
    hostname: Text = Field(default="", max_length=253)
    cpu_isa: CpuIsa = "x86_64"
    numa_nodes: list[NumaNode] = Field(default_factory=list, max_length=1024)  # MAX_NUMNODES
    # The engine keeps a node's GPU sets as bit masks in signed 64-bit integers.
    gpus: list[Gpu] = Field(default_factory=list, max_length=MAX_GPUS)
    links: list[list[LinkLabel]] = Field(
        default_factory=list,
        description="GPU-GPU link labels, row i column j, as nvidia-smi topo -m prints them",
    )
    # One per GPU.
    cpu_links: list[CpuLink] = Field(default_factory=list, max_length=MAX_GPUS)
    nics: list[Nic] = Field(default_factory=list, max_length=MAX_NICS)
    # No more than fit without overlap: one per slice of every GPU.
    mig_instances: list[MigInstance] = Field(
        default_factory=list, max_length=MAX_GPUS * MAX_MIG_SLICES
    )
    fabric: Fabric | None = None
    driver_version: Text | None = Field(default=None, max_length=64)
    cuda_version: Text | None = Field(default=None, max_length=64)
    seq: Seq = 0
    # Set by the reporter; the engine never reads a clock (None: not reported).
    timestamp: datetime | None = None

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        # fullmatch: the pattern's "$" also matches before a final newline.
        if not _NODE_NAME_RE.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a valid node name: lower-case letters, digits, '-' and '.',"
                " starting and ending with a letter or digit"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _valid_labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, val in value.items():
            # fullmatch: "$" alone lets "rack1\n" through, which Kubernetes refuses.
            if not _LABEL_KEY_RE.fullmatch(key):
                raise ValueError(f"label key {key!r} is not a valid Kubernetes label key")
            if not _LABEL_VALUE_RE.fullmatch(val):
                raise ValueError(
                    f"label {key}={val!r}: value is not a valid Kubernetes label value"
                )
        return value

    @field_validator("links")
    @classmethod
    def _normalize_links(cls, value: list[list[str]]) -> list[list[str]]:
        # Spelling only (SOC -> SYS, nv4 -> NV4); unknown labels are left as
        # they are for _check_links, which reports them with their cell.
        return [[_normalized_or_raw(cell) for cell in row] for row in value]

    @model_validator(mode="after")
    def _consistent(self) -> NodeSnapshot:
        errors = [
            *_check_numa(self),
            *_check_gpus(self),
            *_check_links(self),
            *_check_devices(self),
        ]
        if errors:
            raise ValidationError.from_exception_data("NodeSnapshot", errors)
        return self

    # Derived views -----------------------------------------------------

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def link(self, i: int, j: int) -> Link:
        return parse_link(self.links[i][j])

    def numa_cpus(self, numa_id: int) -> tuple[int, ...]:
        node = self._numa_by_id.get(numa_id)
        return node.cpu_list if node is not None else ()

    def numa_cpuset(self, numa_ids: tuple[int, ...]) -> str:
        """The cpuset string of some NUMA nodes (memoised: every placement asks)."""
        memo = self._cpuset_memo
        found = memo.get(numa_ids)
        if found is None:
            found = format_cpuset(c for numa_id in numa_ids for c in self.numa_cpus(numa_id))
            memo[numa_ids] = found
        return found

    @cached_property
    def device_uuids(self) -> frozenset[str]:
        """The UUIDs of its GPUs and MIG instances (the service checks each belongs to one
        node against every node's, so it is computed once per snapshot)."""
        return frozenset(g.uuid for g in self.gpus) | {m.uuid for m in self.mig_instances}

    @cached_property
    def _numa_by_id(self) -> dict[int, NumaNode]:
        return {node.id: node for node in self.numa_nodes}

    @cached_property
    def _cpuset_memo(self) -> dict[tuple[int, ...], str]:
        return {}

    def fabric_domain(self) -> str | None:
        """The multi-node NVLink domain name, only when NVML vouches for it."""
        if self.fabric is None or not self.fabric.usable:
            return None
        return self.fabric.domain


def _normalized_or_raw(cell: str) -> str:
    try:
        return parse_link(cell).label
    except LinkLabelError:
        return cell


def _error(loc: tuple[str | int, ...], message: str, value: Any) -> InitErrorDetails:
    return {
        "type": PydanticCustomError("inconsistent_snapshot", message),
        "loc": loc,
        "input": value,
    }


def _check_numa(snap: NodeSnapshot) -> list[InitErrorDetails]:
    """At most MAX_CPUS CPUs in all, and no CPU in two NUMA nodes (Linux puts each in one;
    a CPU in two could be given to two tasks), counted and compared as ranges."""
    total = 0
    for pos, node in enumerate(snap.numa_nodes):
        total += sum(hi - lo + 1 for lo, hi in node.cpu_spans)
        if total > MAX_CPUS:
            message = f"the NUMA nodes name more than {MAX_CPUS} CPUs in all"
            return [_error(("numa_nodes", pos, "cpus"), message, node.cpus)]
    spans = sorted((lo, hi, pos) for pos, n in enumerate(snap.numa_nodes) for lo, hi in n.cpu_spans)
    # Sorted by first CPU, a span overlaps an earlier one iff it starts before the
    # highest CPU seen so far: each node in an overlap is named once, with one partner.
    shared: dict[int, tuple[int, int]] = {}  # position -> (the other's position, a CPU)
    reach, owner = -1, -1  # the highest CPU seen so far, and the position of its node
    for lo, hi, pos in spans:
        if lo <= reach:
            shared.setdefault(pos, (owner, lo))
            shared.setdefault(owner, (pos, lo))
        if hi > reach:
            reach, owner = hi, pos
    errors: list[InitErrorDetails] = []
    for pos, (other, cpu) in sorted(shared.items()):
        node = snap.numa_nodes[pos]
        message = (
            f"NUMA node {node.id} shares CPU {cpu} with NUMA node"
            f" {snap.numa_nodes[other].id}; a CPU belongs to one NUMA node"
        )
        errors.append(_error(("numa_nodes", pos, "cpus"), message, node.cpus))
    return errors


def _check_gpus(snap: NodeSnapshot) -> Sequence[InitErrorDetails]:
    errors: list[InitErrorDetails] = []
    seen: dict[str, tuple[str | int, ...]] = {}
    files: dict[int, Gpu] = {}  # the N of /dev/nvidiaN -> the GPU that has it
    numa_ids = {n.id for n in snap.numa_nodes}
    if len(numa_ids) != len(snap.numa_nodes):
        errors.append(_error(("numa_nodes",), "NUMA node ids must be unique", None))
    for pos, gpu in enumerate(snap.gpus):
        if gpu.index != pos:
            errors.append(
                _error(
                    ("gpus", pos, "index"),
                    f"GPU at position {pos} has index {gpu.index}; GPUs must be listed by"
                    " index 0..n-1 without gaps",
                    gpu.index,
                )
            )
        errors.extend(_check_uuid(("gpus", pos, "uuid"), gpu.uuid, seen))
        errors.extend(_check_minor(("gpus", pos, "minor_number"), gpu, files))
        if gpu.numa_node is not None and numa_ids and gpu.numa_node not in numa_ids:
            errors.append(
                _error(
                    ("gpus", pos, "numa_node"),
                    f"NUMA node {gpu.numa_node} is not among numa_nodes {sorted(numa_ids)}",
                    gpu.numa_node,
                )
            )
    for pos, mig in enumerate(snap.mig_instances):
        errors.extend(_check_uuid(("mig_instances", pos, "uuid"), mig.uuid, seen))
    return errors


def _check_minor(
    loc: tuple[str | int, ...], gpu: Gpu, files: dict[int, Gpu]
) -> list[InitErrorDetails]:
    """A device file names one GPU: two GPUs with one /dev/nvidiaN would share a job's
    GPU (gres.conf's File=, the device plugin's device specs). A GPU without a minor
    number has the file of its index, so a minor number equal to that index is one too."""
    other = files.setdefault(gpu.device_minor, gpu)
    if other is gpu:
        return []
    file = f"/dev/nvidia{gpu.device_minor}"
    if gpu.minor_number is not None and other.minor_number is not None:
        message = f"GPU {gpu.index} has minor number {gpu.minor_number}, as GPU {other.index} has"
    elif gpu.minor_number is not None:
        message = (
            f"GPU {gpu.index} has minor number {gpu.minor_number}, but {file} is GPU"
            f" {other.index}'s, which has no minor number (its index stands in)"
        )
    else:
        message = (
            f"GPU {gpu.index} has no minor number, so its index stands in, but {file} is"
            f" GPU {other.index}'s (minor number {other.minor_number})"
        )
    return [_error(loc, message, gpu.minor_number)]


def _check_uuid(
    loc: tuple[str | int, ...], uuid: str, seen: dict[str, tuple[str | int, ...]]
) -> list[InitErrorDetails]:
    """A device UUID: unique in the snapshot, one word of a comma-separated device list,
    and not one a held CPU could have."""
    errors: list[InitErrorDetails] = []
    if not _DEVICE_UUID_RE.match(uuid):
        message = (
            f"UUID {uuid!r} has a comma, a space or a character outside printable ASCII;"
            " device UUIDs are listed with commas in the environment a job runs with"
        )
        errors.append(_error(loc, message, uuid))
    if uuid in seen:
        errors.append(_error(loc, f"duplicate UUID {uuid!r}", uuid))
    if uuid.startswith(CPU_DEVICE_PREFIX):
        errors.append(
            _error(
                loc,
                f"UUID {uuid!r} starts with {CPU_DEVICE_PREFIX!r}, which names a CPU among"
                " the devices held on a node",
                uuid,
            )
        )
    seen[uuid] = loc
    return errors


def _check_links(snap: NodeSnapshot) -> Sequence[InitErrorDetails]:
    n = len(snap.gpus)
    if len(snap.links) != n:
        return [
            _error(
                ("links",),
                f"link matrix has {len(snap.links)} rows but the snapshot lists {n} GPUs",
                len(snap.links),
            )
        ]
    errors: list[InitErrorDetails] = []
    for i, row in enumerate(snap.links):
        if len(row) != n:
            errors.append(
                _error(("links", i), f"row {i} has {len(row)} cells but there are {n} GPUs", row)
            )
    if errors:
        return errors
    for i in range(n):
        for j in range(n):
            try:
                parse_link(snap.links[i][j])
            except LinkLabelError as exc:
                errors.append(_error(("links", i, j), str(exc), snap.links[i][j]))
    if errors:
        return errors
    for i in range(n):
        for j in range(n):
            link = parse_link(snap.links[i][j])
            if (i == j) != (link.kind is LinkKind.SELF):
                expected = (
                    "X on the diagonal" if i == j else "a link label, not X, off the diagonal"
                )
                errors.append(_error(("links", i, j), f"expected {expected}", snap.links[i][j]))
            elif j > i and snap.links[i][j] != snap.links[j][i]:
                errors.append(
                    _error(
                        ("links", i, j),
                        f"matrix is not symmetric: links[{i}][{j}]={snap.links[i][j]!r}"
                        f" but links[{j}][{i}]={snap.links[j][i]!r}",
                        snap.links[i][j],
                    )
                )
    return errors


def _check_devices(snap: NodeSnapshot) -> Sequence[InitErrorDetails]:
    n = len(snap.gpus)
    errors: list[InitErrorDetails] = []
    for pos, nic in enumerate(snap.nics):
        if len(nic.links) != n:
            errors.append(
                _error(
                    ("nics", pos, "links"),
                    f"NIC {nic.name} lists {len(nic.links)} GPU relations but there are {n} GPUs",
                    nic.links,
                )
            )
    for pos, cpu_link in enumerate(snap.cpu_links):
        if cpu_link.gpu >= n:
            errors.append(
                _error(("cpu_links", pos, "gpu"), f"no GPU with index {cpu_link.gpu}", cpu_link.gpu)
            )
    taken: dict[int, int] = {}  # GPU index -> bits of the slices instances take
    for pos, mig in enumerate(snap.mig_instances):
        loc = ("mig_instances", pos)
        if mig.parent_gpu >= n:
            errors.append(
                _error((*loc, "parent_gpu"), f"no GPU with index {mig.parent_gpu}", mig.parent_gpu)
            )
            continue
        if not snap.gpus[mig.parent_gpu].mig_enabled:
            errors.append(
                _error(
                    (*loc, "parent_gpu"),
                    f"GPU {mig.parent_gpu} has MIG instances but mig_enabled is false",
                    mig.parent_gpu,
                )
            )
        errors.extend(_check_slices(loc, mig, taken))
    return errors


def _check_slices(
    loc: tuple[str | int, ...], mig: MigInstance, taken: dict[int, int]
) -> list[InitErrorDetails]:
    """An instance's slices: within the GPU's bound, and none another instance took (a
    bit mask per GPU, so a list of instances costs its length, not its square)."""
    start, end = mig.placement_start, mig.placement_start + mig.placement_size
    if end > MAX_MIG_SLICES:
        message = f"slices {start}..{end - 1} run past slice {MAX_MIG_SLICES - 1}"
        return [_error((*loc, "placement_start"), message, start)]
    span = ((1 << mig.placement_size) - 1) << start
    held = taken.get(mig.parent_gpu, 0)
    taken[mig.parent_gpu] = held | span
    if held & span:
        message = f"slices {start}..{end - 1} overlap another instance on GPU {mig.parent_gpu}"
        return [_error((*loc, "placement_start"), message, start)]
    return []
