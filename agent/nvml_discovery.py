"""A node snapshot from NVML: GPUs, NVLink (NVSwitch-aware), PCIe, MIG, fabric, health.

NVSwitch: on DGX/HGX A100, H100, B200 and GB200 every NVLink of a GPU ends
at a switch, not at another GPU, so a tool that looks for GPU-to-GPU links
sees none. Here each link's remote device type is asked; two GPUs that both
have active links to switches are joined through the switch with the
smaller of their two active link counts (``NVS<n>``). Drivers that cannot
say the remote type are handled by the remote PCI address: an address that
is not one of this node's GPUs but that two or more of them reach is a
switch. A link to an address that is neither (a GPU hidden from the agent's
container, a garbled answer) is left out with a warning: taken for a switch,
two GPUs each linked to a different unknown device would be reported joined.

Errors are contained where they happen, because one GPU falling off the bus
must not hide the other seven (it once blocked a node's admissions for
days):

- ``NotSupported`` (and ``FunctionNotFound``, and ``InvalidArgument`` for a
  link number past the GPU's last link): the feature is absent;
- ``GpuIsLost`` anywhere: the GPU is reported ``unhealthy`` with the reason;
- any other error while reading what a GPU *is* (UUID, name, memory, PCI
  address, MIG mode): the GPU is ``unhealthy``, since placing work on a GPU
  that cannot be described (or whose MIG mode is unknown) is unsafe;
- any other error on one NVLink: that link is not counted (the pair falls
  back to its remaining lanes or to PCIe) and the GPU's ``health_reason``
  says which link; the GPU stays healthy;
- any other error on an optional fact (NUMA affinity, C2C, fabric): the fact
  is left out and noted in ``health_reason``.

Only a failure of NVML as a whole (the GPU count), or an answer that cannot
describe the node (two GPUs with one UUID), raises ``DiscoveryError``.
"""

from __future__ import annotations

import hashlib
import logging
import math
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pynvml  # type: ignore[import-untyped]
from pydantic import ValidationError

from agent.host import Host, HostFacts
from agent.nvml_api import Nvml
from agent.nvml_calls import (
    ABSENT,
    NO_SUCH_LINK,
    GpuLost,
    Unusable,
    call,
    device_uuid,
    field_text,
    optional,
    text,
)
from agent.nvml_mig import MigIds, read_migs
from placement.cpuset import parse_cpuset
from placement.snapshot import CpuLink, Fabric, FabricState, Gpu, Health, MigInstance, NumaNode

log = logging.getLogger("topoplace.agent")

T = TypeVar("T")

_LEVEL_LABELS = {
    pynvml.NVML_TOPOLOGY_INTERNAL: "PIX",
    pynvml.NVML_TOPOLOGY_SINGLE: "PIX",
    pynvml.NVML_TOPOLOGY_MULTIPLE: "PXB",
    pynvml.NVML_TOPOLOGY_HOSTBRIDGE: "PHB",
    pynvml.NVML_TOPOLOGY_NODE: "NODE",
    pynvml.NVML_TOPOLOGY_SYSTEM: "SYS",
}
_FABRIC_STATES: dict[int, FabricState] = {
    pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: "not_supported",
    pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED: "not_started",
    pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS: "in_progress",
    pynvml.NVML_GPU_FABRIC_STATE_COMPLETED: "completed",
}
_NO_SUMMARY = pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED  # v2 has no summary
_FABRIC_HEALTHY = (
    pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED,
    pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY,
)


# The longest UUID, model name and PCI bus id a snapshot's Gpu carries.
TEXT_LIMIT = 128
BUS_ID_LIMIT = 64
VERSION_LIMIT = 64  # the snapshot's driver_version
MEMORY_MIB_LIMIT = 2**31 - 1  # a snapshot's counts are 32-bit
MINOR_LIMIT = 2**31 - 1  # and so is a minor number


class DiscoveryError(RuntimeError):
    """NVML as a whole did not answer; nothing about the node can be said."""


@dataclass(frozen=True)
class NvmlReport:
    """What NVML says about a node; the host and identity parts are added by the caller."""

    gpus: list[Gpu]
    links: list[list[str]]
    cpu_links: list[CpuLink]
    mig_instances: list[MigInstance]
    fabric: Fabric | None
    driver_version: str | None
    cuda_version: str | None
    # MIG instance UUID -> its GPU and compute instance ids (for the device plugin).
    mig_ids: dict[str, MigIds] = field(default_factory=dict)


@dataclass
class _Reading:
    """One GPU as read so far."""

    index: int
    handle: Any = None
    uuid: str = ""
    model: str = "unknown"
    memory_mib: int = 0
    bus_id: str = ""
    numa_node: int | None = None
    minor_number: int | None = None  # the N of /dev/nvidiaN, when NVML says
    mig_enabled: bool = False
    lost: str = ""  # why the GPU is unhealthy, empty when it is not
    notes: list[str] = field(default_factory=list)
    peer_links: Counter[str] = field(default_factory=Counter)  # remote GPU bus id -> links
    switch_links: int = 0
    # Remote type unknown and no GPU's address: a switch if another GPU reaches it too.
    untyped_links: Counter[str] = field(default_factory=Counter)
    c2c: bool = False
    fabric: Fabric | None = None
    migs: list[MigInstance] = field(default_factory=list)
    mig_ids: dict[str, MigIds] = field(default_factory=dict)


def normalize_bus_id(bus_id: str) -> str:
    """``0000:18:00.0`` and ``00000000:18:00.0`` both as NVML prints it: ``00000000:18:00.0``."""
    text = bus_id.strip().upper()
    domain, sep, rest = text.partition(":")
    if not sep or not domain or not all(c in "0123456789ABCDEF" for c in domain):
        return text  # not an address: kept as said, so it matches no GPU's
    return f"{int(domain, 16):08X}:{rest}"


def discover(
    nvml: Nvml,
    host: Host,
    facts: HostFacts,
    known: Mapping[int, Gpu] | None = None,
    node: str = "",
) -> NvmlReport:
    """Read every GPU.

    ``known`` (the GPUs of the last report) names the GPUs that can no longer
    say who they are; one never read gets a placeholder UUID made from ``node``
    (the node's name) and its index.
    """
    try:
        count = nvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        raise DiscoveryError(f"NVML did not list the GPUs: {exc}") from None
    numa_ids = {node.id for node in facts.numa_nodes}
    readings = [_read_gpu(nvml, host, facts.numa_nodes, numa_ids, i) for i in range(count)]
    # Before the links are read: a lost GPU's address from the last report is still a GPU's,
    # not (where the driver cannot say a link's remote type) a switch's.
    _fill_unknown(readings, known or {}, node)
    _refuse_shared_uuids(readings)
    _drop_shared_minors(readings)
    _drop_minors_of_fallback_files(readings)
    bus_ids = {r.bus_id for r in readings if r.bus_id}
    for reading in readings:
        if not reading.lost:
            _read_optional(nvml, reading, bus_ids)
    _drop_shared_mig_uuids(readings)
    _count_untyped_links(readings)
    links = _link_matrix(nvml, readings)  # first: it may add notes to the GPUs
    return NvmlReport(
        gpus=[_gpu(r) for r in readings],
        links=links,
        cpu_links=[
            CpuLink(
                gpu=r.index, kind="nvlink-c2c" if facts.cpu_isa == "aarch64" else "nvlink-fusion"
            )
            for r in readings
            if r.c2c and not r.lost
        ],
        mig_instances=[m for r in readings if not r.lost for m in r.migs],
        fabric=_node_fabric(readings),
        driver_version=_driver_version(nvml),
        cuda_version=_cuda_version(_system(nvml.nvmlSystemGetCudaDriverVersion)),
        mig_ids={k: v for r in readings if not r.lost for k, v in r.mig_ids.items()},
    )


def _read_gpu(
    nvml: Nvml, host: Host, numa_nodes: Sequence[NumaNode], numa_ids: set[int], index: int
) -> _Reading:
    reading = _Reading(index)
    try:
        reading.handle = call("nvmlDeviceGetHandleByIndex", nvml.nvmlDeviceGetHandleByIndex, index)
        handle = reading.handle
        uuid = call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, handle)
        reading.uuid = device_uuid("nvmlDeviceGetUUID", uuid)
        model = call("nvmlDeviceGetName", nvml.nvmlDeviceGetName, handle)
        reading.model = text("nvmlDeviceGetName", model, TEXT_LIMIT)
        memory = call("nvmlDeviceGetMemoryInfo", nvml.nvmlDeviceGetMemoryInfo, handle)
        reading.memory_mib = _memory_mib(int(memory.total))
        pci = call("nvmlDeviceGetPciInfo", nvml.nvmlDeviceGetPciInfo, handle)
        bus_id = field_text("nvmlDeviceGetPciInfo", pci, "busId", BUS_ID_LIMIT)
        reading.bus_id = normalize_bus_id(bus_id)
        reading.mig_enabled = _mig_mode(nvml, handle)
        reading.minor_number = _minor_number(nvml, reading)
    except GpuLost as exc:
        reading.lost = f"GPU is lost: {exc}"
        return reading
    except (pynvml.NVMLError, Unusable) as exc:
        reading.lost = f"NVML cannot describe this GPU: {exc}"
        return reading
    try:
        reading.numa_node = _numa_node(nvml, host, reading, numa_nodes, numa_ids)
    except GpuLost as exc:
        reading.lost = f"GPU is lost: {exc}"
    return reading


def _minor_number(nvml: Nvml, reading: _Reading) -> int | None:
    """The N of the GPU's /dev/nvidiaN. Not its index: the driver numbers device files in
    probe order, NVML orders GPUs by PCI bus id. None (the index stands in) when NVML
    cannot say, or says a number no device file has."""
    found = optional(
        reading.notes, "nvmlDeviceGetMinorNumber", nvml.nvmlDeviceGetMinorNumber, reading.handle
    )
    if found is None:
        return None
    if not isinstance(found, int) or not 0 <= found <= MINOR_LIMIT:
        reading.notes.append(f"nvmlDeviceGetMinorNumber answered {found!r}, no device file's")
        return None
    return found


def _memory_mib(total_bytes: int) -> int:
    """The GPU's memory in MiB; ``Unusable`` past what a snapshot carries (2^31 - 1 MiB)."""
    mib = total_bytes // (1024 * 1024)
    if mib > MEMORY_MIB_LIMIT:
        raise Unusable(f"nvmlDeviceGetMemoryInfo answered {total_bytes} bytes, past any GPU's")
    return mib


def _mig_mode(nvml: Nvml, handle: Any) -> bool:
    try:
        current, _pending = call("nvmlDeviceGetMigMode", nvml.nvmlDeviceGetMigMode, handle)
    except ABSENT:
        return False
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _numa_node(
    nvml: Nvml, host: Host, reading: _Reading, numa_nodes: Sequence[NumaNode], numa_ids: set[int]
) -> int | None:
    """The GPU's NUMA node: NVML's memory affinity, else its CPU affinity, else sysfs."""
    words = max(1, math.ceil((max(numa_ids, default=0) + 1) / 64))
    mask = optional(
        reading.notes,
        "nvmlDeviceGetMemoryAffinity",
        nvml.nvmlDeviceGetMemoryAffinity,
        reading.handle,
        words,
        pynvml.NVML_AFFINITY_SCOPE_NODE,
    )
    nodes = _bits(mask) if mask is not None else []
    if len(nodes) == 1 and nodes[0] in numa_ids:
        return nodes[0]
    cpu_words = max(1, math.ceil((max(_all_cpus(numa_nodes), default=0) + 1) / 64))
    cpu_mask = optional(
        reading.notes,
        "nvmlDeviceGetCpuAffinity",
        nvml.nvmlDeviceGetCpuAffinity,
        reading.handle,
        cpu_words,
    )
    cpus = set(_bits(cpu_mask)) if cpu_mask is not None else set()
    holding = [n.id for n in numa_nodes if cpus and cpus <= set(n.cpu_list)]
    if len(holding) == 1:
        return holding[0]
    node = host.device_numa_node(reading.bus_id)
    return node if node in numa_ids else None


def _all_cpus(numa_nodes: Sequence[NumaNode]) -> list[int]:
    return [cpu for node in numa_nodes for cpu in parse_cpuset(node.cpus)]


def _bits(words: Any) -> list[int]:
    """Set bit numbers of an NVML mask (an array of 64-bit words, lowest word first)."""
    return [64 * w + b for w, word in enumerate(words) for b in range(64) if int(word) >> b & 1]


def _read_optional(nvml: Nvml, reading: _Reading, bus_ids: set[str]) -> None:
    try:
        _read_nvlinks(nvml, reading, bus_ids)
        info = optional(
            reading.notes,
            "nvmlDeviceGetC2cModeInfoV",
            nvml.nvmlDeviceGetC2cModeInfoV,
            reading.handle,
        )
        reading.c2c = bool(info is not None and info.isC2cEnabled)
        reading.fabric = _fabric(nvml, reading)
        if reading.mig_enabled:
            reading.migs = read_migs(
                nvml, reading.handle, reading.index, reading.notes, reading.mig_ids
            )
    except GpuLost as exc:
        reading.lost = f"GPU is lost: {exc}"


def _read_nvlinks(nvml: Nvml, reading: _Reading, bus_ids: set[str]) -> None:
    handle = reading.handle
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = call("nvmlDeviceGetNvLinkState", nvml.nvmlDeviceGetNvLinkState, handle, link)
            if not active:
                continue  # unused or down: it carries nothing
            remote_type = _remote_type(nvml, handle, link)
            if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH:
                reading.switch_links += 1
                continue
            if remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_IBMNPU:
                continue  # a link to a POWER CPU, not to a GPU
            pci = call(
                "nvmlDeviceGetNvLinkRemotePciInfo",
                nvml.nvmlDeviceGetNvLinkRemotePciInfo,
                handle,
                link,
            )
            name = "nvmlDeviceGetNvLinkRemotePciInfo"
            remote = normalize_bus_id(field_text(name, pci, "busId", BUS_ID_LIMIT))
            if remote in bus_ids:
                reading.peer_links[remote] += 1
            elif remote_type == pynvml.NVML_NVLINK_DEVICE_TYPE_GPU:
                reading.notes.append(
                    f"NVLink {link} ends at GPU {remote}, none of this node's: left out"
                )
            else:
                reading.untyped_links[remote] += 1
        except NO_SUCH_LINK:
            continue
        except GpuLost:
            raise
        except (pynvml.NVMLError, Unusable) as exc:
            reading.notes.append(f"NVLink {link} unhealthy: {exc}")


def _count_untyped_links(readings: list[_Reading]) -> None:
    """Links of unknown remote type to an address none of the GPUs has: a switch's when
    two or more GPUs reach that address (a switch joins GPUs), else an unknown peer's,
    left out and noted."""
    reached_by = Counter(a for r in readings if not r.lost for a in r.untyped_links)
    for reading in readings:
        for address, count in sorted(reading.untyped_links.items()):
            if reading.lost:
                continue
            if reached_by[address] > 1:
                reading.switch_links += count
            else:
                reading.notes.append(
                    f"{count} NVLink(s) to {address}, of unknown type and reached by no other"
                    " GPU of this node (so no switch): left out"
                )


def _remote_type(nvml: Nvml, handle: Any, link: int) -> int | None:
    try:
        value: int = call(
            "nvmlDeviceGetNvLinkRemoteDeviceType",
            nvml.nvmlDeviceGetNvLinkRemoteDeviceType,
            handle,
            link,
        )
    except ABSENT:
        return None  # older drivers: decided by the remote PCI address
    return None if value == pynvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN else value


def _fabric_info(nvml: Nvml, reading: _Reading) -> Any:
    """The GPU's fabric info, v3 (with the health summary) or, from a driver that predates
    it (ArgumentVersionMismatch), v2; None when absent or failing (noted)."""
    name, fill = "nvmlDeviceGetGpuFabricInfoV", nvml.nvmlDeviceGetGpuFabricInfoV
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    try:
        call(name, fill, reading.handle, info)
        return info
    except pynvml.NVMLError_ArgumentVersionMismatch:
        info = pynvml.c_nvmlGpuFabricInfo_v2_t()
    except ABSENT:
        return None
    except pynvml.NVMLError as exc:
        reading.notes.append(f"{name}: {exc}")
        return None
    done = optional(reading.notes, name, fill, reading.handle, info)
    return None if done is None else info


def _fabric(nvml: Nvml, reading: _Reading) -> Fabric | None:
    info = _fabric_info(nvml, reading)
    if info is None:
        return None
    state = _FABRIC_STATES.get(int(info.state), "not_supported")
    if state == "not_supported":
        return None
    try:
        return Fabric(
            cluster_uuid=str(uuidlib.UUID(bytes=bytes(info.clusterUuid))),
            clique_id=int(info.cliqueId),
            state=state,
            healthy=int(info.status) == pynvml.NVML_SUCCESS
            and int(getattr(info, "healthSummary", _NO_SUMMARY)) in _FABRIC_HEALTHY,
        )
    except ValidationError as exc:
        # A clique id past 2^31 - 1 (NVML's is unsigned 32-bit): the fabric is left out,
        # as any fabric NVML cannot vouch for, not the node's round failed.
        first = exc.errors()[0]
        reading.notes.append(f"fabric {first['loc'][0]} {first['input']!r}: {first['msg']}")
        return None


def _fill_unknown(readings: list[_Reading], known: Mapping[int, Gpu], node: str) -> None:
    """A GPU that cannot say who it is keeps the identity its index had last time, unless
    that was another GPU: one that says so itself this round (the count shrank and the GPUs
    after the one gone moved up an index), or not the UUID this one did say."""
    said = {r.uuid for r in readings if r.uuid}
    for r in readings:
        before = known.get(r.index)
        if before is not None and (before.uuid != r.uuid if r.uuid else before.uuid in said):
            before = None
        if not r.uuid:
            r.uuid = before.uuid if before else unreadable_uuid(node, r.index)
        if r.model == "unknown" and before:
            r.model = before.model
        if not r.bus_id and before:
            r.bus_id = before.pci_bus_id
        if not r.memory_mib and before:
            r.memory_mib = before.memory_mib
        if r.numa_node is None and before:
            r.numa_node = before.numa_node
        if r.minor_number is None and before:
            r.minor_number = before.minor_number


def _refuse_shared_uuids(readings: list[_Reading]) -> None:
    """``DiscoveryError`` naming the UUID and GPUs when NVML gives two GPUs one UUID: the
    service keys devices by UUID, so it would take them for one (and refuse the snapshot
    with a validation dump); which of them is which is unknown, so nothing is sent."""
    holders: dict[str, list[int]] = {}
    for r in readings:
        holders.setdefault(r.uuid, []).append(r.index)
    for uuid, indexes in holders.items():
        if len(indexes) > 1:
            *rest, last = (str(i) for i in indexes)
            raise DiscoveryError(
                f"NVML gives the UUID {uuid} for GPUs {', '.join(rest)} and {last}; a UUID"
                " names one GPU, so no snapshot is sent until the driver tells them apart"
                " (compare nvidia-smi -L)"
            )


def _drop_shared_mig_uuids(readings: list[_Reading]) -> None:
    """MIG instances whose UUID another device of the node also says (another instance, a
    GPU): which is which is unknown, so each such instance is left out and noted, not the
    node's snapshot refused (the service keys devices by UUID) with every other GPU."""
    counts = Counter(r.uuid for r in readings)
    counts.update(m.uuid for r in readings if not r.lost for m in r.migs)
    for r in readings:
        shared = [m for m in r.migs if counts[m.uuid] > 1]
        for mig in shared:
            r.notes.append(f"MIG instance {mig.uuid} has a UUID another device has: left out")
            r.mig_ids.pop(mig.uuid, None)
        r.migs = [m for m in r.migs if counts[m.uuid] == 1]


def _drop_shared_minors(readings: list[_Reading]) -> None:
    """Two GPUs NVML gives one minor number: which device file is whose is unknown, so
    neither is said (each falls back to its index) and each notes why; the node is still
    reported, unlike with a shared UUID, since placement does not need the number."""
    holders: dict[int, list[_Reading]] = {}
    for r in readings:
        if r.minor_number is not None:
            holders.setdefault(r.minor_number, []).append(r)
    for minor, sharing in holders.items():
        if len(sharing) < 2:
            continue
        indexes = ", ".join(str(r.index) for r in sharing)
        for r in sharing:
            r.notes.append(f"NVML gives the minor number {minor} for GPUs {indexes}")
            r.minor_number = None


def _drop_minors_of_fallback_files(readings: list[_Reading]) -> None:
    """A GPU without a minor number is given /dev/nvidia<index>: a minor number naming
    that file would hand one device file to two GPUs (the service refuses such a
    snapshot). Which of the two the file is, is unknown, so that minor number is left out
    too and its GPU falls back to its own index, which may name another GPU's file in
    turn: repeated until every GPU has a file of its own (indexes are unique)."""
    while True:
        fallback = {r.index for r in readings if r.minor_number is None}
        clashing = [r for r in readings if r.minor_number in fallback]
        if not clashing:
            return
        for r in clashing:
            r.notes.append(
                f"the minor number {r.minor_number} is the device file GPU {r.minor_number}"
                " falls back to (NVML gives it none)"
            )
            r.minor_number = None


def unreadable_uuid(node: str, index: int) -> str:
    """A placeholder UUID for a GPU never read, unique to its node: the service refuses a
    device UUID another node lists, so one shared by every node with a lost GPU 0 would
    keep all but the first such node from being reported."""
    digest = hashlib.sha256(node.encode("utf-8")).hexdigest()[:16]
    return f"GPU-unreadable-{index}-{digest}"


def _gpu(r: _Reading) -> Gpu:
    reason = r.lost or "; ".join(r.notes)
    if r.lost or r.notes:
        log.warning("GPU %d (%s): %s", r.index, r.uuid, reason)
    return Gpu(
        index=r.index,
        uuid=r.uuid,
        model=r.model,
        memory_mib=r.memory_mib,
        pci_bus_id=r.bus_id,
        numa_node=r.numa_node,
        minor_number=r.minor_number,
        health=Health.UNHEALTHY if r.lost else Health.HEALTHY,
        health_reason=reason[:500],
        mig_enabled=r.mig_enabled,
    )


def _link_matrix(nvml: Nvml, readings: list[_Reading]) -> list[list[str]]:
    n = len(readings)
    links = [["X" if i == j else "SYS" for j in range(n)] for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            label = _pair_label(nvml, readings[i], readings[j])
            links[i][j] = links[j][i] = label
    # A GPU lost while the pairs were read: its pairs read before then say SYS too.
    for r in readings:
        if r.lost:
            for j in range(n):
                if j != r.index:
                    links[r.index][j] = links[j][r.index] = "SYS"
    return links


def _pair_label(nvml: Nvml, a: _Reading, b: _Reading) -> str:
    if a.lost or b.lost:
        return "SYS"  # nothing is known of a lost GPU's links; it gets no work anyway
    # Counted from both ends: a link that failed on one side does not count.
    direct = min(a.peer_links[b.bus_id], b.peer_links[a.bus_id])
    switched = min(a.switch_links, b.switch_links)
    if switched and switched >= direct:
        return f"NVS{switched}"
    if direct:
        return f"NV{direct}"
    try:
        level = nvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)
    except pynvml.NVMLError_GpuIsLost as exc:
        # Which of the two fell off the bus is asked of each alone; that one is lost,
        # not reported healthy with its pairs noted on every other GPU.
        for r in (a, b):
            if _gone(nvml, r):
                r.lost = f"GPU is lost: {exc} (nvmlDeviceGetTopologyCommonAncestor)"
        if not (a.lost or b.lost):
            a.notes.append(f"PCIe relation to GPU {b.index} unknown: {exc}")
        return "SYS"
    except pynvml.NVMLError as exc:
        a.notes.append(f"PCIe relation to GPU {b.index} unknown: {exc}")
        return "SYS"
    return _LEVEL_LABELS.get(level, "SYS")


def _gone(nvml: Nvml, reading: _Reading) -> bool:
    """Whether NVML says the GPU is lost when asked about it alone."""
    try:
        call("nvmlDeviceGetUUID", nvml.nvmlDeviceGetUUID, reading.handle)
    except GpuLost:
        return True
    except (pynvml.NVMLError, Unusable):
        return False
    return False


def _node_fabric(readings: list[_Reading]) -> Fabric | None:
    """The node's fabric: the first registered GPU's, vouched for only where every GPU
    that reports one agrees. The engine gives a node's GPUs to a gang as members of the
    node's domain; taken from the first GPU alone, a node with a GPU in another clique,
    unhealthy or still registering was placed as if all its GPUs reached the domain."""
    fabrics = [r.fabric for r in readings if r.fabric is not None and not r.lost]
    completed = [f for f in fabrics if f.state == "completed"]
    chosen = completed or fabrics
    if not chosen:
        return None
    first = chosen[0]
    agreed = all(f.usable and f.domain == first.domain for f in fabrics)
    return first if agreed or not first.usable else first.model_copy(update={"healthy": False})


def _system(fn: Callable[[], T]) -> T | None:
    try:
        return fn()
    except pynvml.NVMLError as exc:
        log.warning("NVML: %s: %s", getattr(fn, "__name__", "call"), exc)
        return None


def _driver_version(nvml: Nvml) -> str | None:
    """The driver version, or None when NVML cannot say it in a string a snapshot carries."""
    name = "nvmlSystemGetDriverVersion"
    try:
        return text(name, call(name, nvml.nvmlSystemGetDriverVersion), VERSION_LIMIT)
    except (pynvml.NVMLError, Unusable) as exc:
        log.warning("NVML: %s: %s", name, exc)
        return None


def _cuda_version(value: int | None) -> str | None:
    # NVML encodes CUDA 12.8 as 12080.
    return None if value is None else f"{value // 1000}.{value % 1000 // 10}"
