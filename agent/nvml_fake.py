"""An in-memory NVML: pynvml's functions, return shapes and errors, over a described machine.

``FakeNvml.from_snapshot(snapshot)`` turns a topology description (any
``NodeSnapshot``, e.g. an engine profile) into what a driver would report:

- ``NV<n>`` between two GPUs: n NVLinks on each, remote type GPU, remote PCI
  address the peer's;
- ``NVS<n>``: n NVLinks on each GPU, each ending at one of the node's
  NVSwitches (remote type SWITCH, the switch's own PCI address);
- PCIe levels: ``nvmlDeviceGetTopologyCommonAncestor`` answers them; pairs
  joined by NVLink answer NODE or SYS by NUMA node, as real boxes do;
- MIG instances as MIG devices with GPU instances, placements and the
  profile ids NVML uses on 80 GB A100/H100; fabric info, C2C mode, NUMA and
  CPU affinity masks;
- minor numbers (``/dev/nvidia<N>``): the snapshot's, else the index; set a
  ``FakeGpu.minor_number`` to number device files otherwise (None: the
  driver answers NotSupported).

Values come back in pynvml's own ctypes structures (``nvmlPciInfo_t``,
``c_nvmlMemory_t``, ...), filled the way the driver fills them, and failures
are pynvml's own ``NVMLError`` subclasses: a lost GPU raises
``NVMLError_GpuIsLost`` from every call on it, ``fail`` makes one function
raise any error for one GPU (``NoPermission``, ``NotSupported``, ...),
``set_link_active`` takes a link down. NVLink field values (throughput per
link by ``scopeId``, CRC, replay and recovery counters per link) count up:
each read of an active link's throughput adds ``traffic_kib`` sent and
received, as a busy link would; ``add_errors`` raises a link's error
counters, and ``unsupported_fields`` lists field ids that answer
``NVML_ERROR_NOT_SUPPORTED`` in their slot. ``available=False`` behaves like a
machine without the driver: ``nvmlInit`` raises ``NVMLError_LibraryNotFound``.
Handles are opaque objects, as they are to callers of the real library.
"""

from __future__ import annotations

import ctypes
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

import pynvml  # type: ignore[import-untyped]

from agent.host import HostFacts, StaticHost, sysfs_bus_id
from placement.gpu_family import gpu_family
from placement.links import LinkKind, parse_link
from placement.snapshot import Fabric, NodeSnapshot

_NVLINK_VERSION = {"pascal": 1, "volta": 2, "ampere": 3, "hopper": 4, "blackwell": 5}
_PCIE_LEVELS = {
    LinkKind.PIX: pynvml.NVML_TOPOLOGY_SINGLE,
    LinkKind.PXB: pynvml.NVML_TOPOLOGY_MULTIPLE,
    LinkKind.PHB: pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    LinkKind.NODE: pynvml.NVML_TOPOLOGY_NODE,
    LinkKind.SYS: pynvml.NVML_TOPOLOGY_SYSTEM,
}
# MIG profile name -> (NVML profile index, GPU instance profile id), as an
# 80 GB A100 or H100 reports them (`nvidia-smi mig -lgip`).
MIG_PROFILES: dict[str, tuple[int, int]] = {
    "1g.10gb": (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE, 19),
    "2g.20gb": (pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE, 14),
    "3g.40gb": (pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE, 9),
    "4g.40gb": (pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE, 5),
    "7g.80gb": (pynvml.NVML_GPU_INSTANCE_PROFILE_7_SLICE, 0),
    "1g.20gb": (pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15),
}
MAX_MIG_DEVICES = 7
# NVML's per-link error counter fields (links 0-11): field id -> (FakeLink attribute, link).
_LINK_ERROR_FIELDS: dict[int, tuple[str, int]] = {
    getattr(pynvml, f"NVML_FI_DEV_NVLINK_{kind}_ERROR_COUNT_L{link}"): (name, link)
    for kind, name in (
        ("CRC_FLIT", "crc_flit_errors"),
        ("CRC_DATA", "crc_data_errors"),
        ("REPLAY", "replay_errors"),
        ("RECOVERY", "recovery_errors"),
    )
    for link in range(12)
}
SWITCHES = 4  # NVSwitch chips on an HGX baseboard; the GPUs' links are spread over them


@dataclass
class FakeLink:
    remote_type: int
    remote_bus_id: str
    active: bool = True
    version: int = 4
    error: type[pynvml.NVMLError] | None = None  # raised by every call about this link
    # NVML field values: data sent and received (KiB) and the error counters, since load.
    tx_kib: int = 0
    rx_kib: int = 0
    crc_flit_errors: int = 0
    crc_data_errors: int = 0
    replay_errors: int = 0
    recovery_errors: int = 0


@dataclass
class FakeMig:
    uuid: str
    gpu_instance_id: int
    profile: str
    start: int
    size: int
    compute_instance_id: int = 0


@dataclass
class FakeGpu:
    uuid: str
    name: str
    memory_mib: int
    bus_id: str
    numa_node: int | None = None
    # /dev/nvidia<minor>; None: NotSupported (as drivers without device files answer)
    minor_number: int | None = None
    cpus: tuple[int, ...] = ()
    mig_enabled: bool = False
    migs: list[FakeMig] = field(default_factory=list)
    links: list[FakeLink] = field(default_factory=list)
    fabric: Fabric | None = None
    c2c: bool = False
    lost: bool = False
    # function name -> the error that function raises for this GPU
    errors: dict[str, type[pynvml.NVMLError]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Device:
    index: int


@dataclass(frozen=True)
class _MigDevice:
    parent: int
    slot: int


@dataclass(frozen=True)
class _GpuInstance:
    parent: int
    instance_id: int


class FakeNvml:
    """pynvml's functions over ``gpus``; ``pcie[i][j]`` is NVML's topology level of a pair."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        pcie: list[list[int]],
        *,
        driver_version: str = "570.124.06",
        cuda_version: int = 12080,
        available: bool = True,
        traffic_kib: int = 1024,
    ) -> None:
        self.gpus = gpus
        self.pcie = pcie
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.available = available
        self.initialized = False
        self.traffic_kib = traffic_kib
        self.unsupported_fields: set[int] = set()

    # -- building ------------------------------------------------------------

    @classmethod
    def from_snapshot(cls, snap: NodeSnapshot, **kwargs: Any) -> FakeNvml:
        cpus = {node.id: node.cpu_list for node in snap.numa_nodes}
        c2c = {link.gpu for link in snap.cpu_links if link.kind != "pcie"}
        gpus = [
            FakeGpu(
                uuid=g.uuid,
                name=g.model,
                memory_mib=g.memory_mib,
                bus_id=g.pci_bus_id,
                numa_node=g.numa_node,
                minor_number=g.device_minor,
                cpus=cpus.get(g.numa_node, ()) if g.numa_node is not None else (),
                mig_enabled=g.mig_enabled,
                fabric=snap.fabric,
                c2c=g.index in c2c,
            )
            for g in snap.gpus
        ]
        for pos, mig in enumerate(snap.mig_instances):
            gpu = gpus[mig.parent_gpu]
            gpu.migs.append(
                FakeMig(mig.uuid, pos + 1, mig.profile, mig.placement_start, mig.placement_size)
            )
        _wire_nvlinks(snap, gpus)
        n = snap.gpu_count
        pcie = [[_pcie_level(snap, i, j) for j in range(n)] for i in range(n)]
        if snap.driver_version is not None:
            kwargs.setdefault("driver_version", snap.driver_version)
        return cls(gpus, pcie, **kwargs)

    # -- faults --------------------------------------------------------------

    def lose_gpu(self, index: int) -> None:
        """The GPU fell off the bus: every call about it raises GpuIsLost from now on."""
        self.gpus[index].lost = True

    def fail(self, function: str, index: int, error: type[pynvml.NVMLError]) -> None:
        """``function`` raises ``error`` for GPU ``index`` from now on."""
        self.gpus[index].errors[function] = error

    def set_link_active(self, index: int, link: int, active: bool) -> None:
        self.gpus[index].links[link].active = active

    def fail_link(self, index: int, link: int, error: type[pynvml.NVMLError]) -> None:
        self.gpus[index].links[link].error = error

    # -- helpers -------------------------------------------------------------

    def add_errors(self, index: int, link: int, **counts: int) -> None:
        """Raise link ``link`` of GPU ``index``'s error counters (``crc_flit_errors=2``)."""
        found = self.gpus[index].links[link]
        for name, count in counts.items():
            setattr(found, name, getattr(found, name) + count)

    def _check(self) -> None:
        if not self.initialized:
            raise pynvml.NVMLError_Uninitialized()

    def _gpu(self, handle: Any, function: str) -> FakeGpu:
        self._check()
        if isinstance(handle, _MigDevice):
            index = handle.parent
        elif isinstance(handle, _Device):
            index = handle.index
        else:
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError_GpuIsLost()
        if function in gpu.errors:
            raise gpu.errors[function]()
        return gpu

    def _link(self, handle: Any, link: int, function: str) -> FakeLink:
        gpu = self._gpu(handle, function)
        if not gpu.links:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= link < len(gpu.links):
            raise pynvml.NVMLError_InvalidArgument()
        found = gpu.links[link]
        if found.error is not None:
            raise found.error()
        return found

    def _mig(self, handle: _MigDevice, function: str) -> FakeMig:
        gpu = self._gpu(handle, function)
        return gpu.migs[handle.slot]

    # -- library ---------------------------------------------------------------

    def nvmlInit(self) -> None:
        if not self.available:
            raise pynvml.NVMLError_LibraryNotFound()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check()
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check()
        return self.cuda_version

    # -- devices ---------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._check()
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        handle = _Device(index)
        self._gpu(handle, "nvmlDeviceGetHandleByIndex")
        return handle

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, _MigDevice):
            return self._mig(handle, "nvmlDeviceGetUUID").uuid
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        gpu = self._gpu(handle, "nvmlDeviceGetName")
        if isinstance(handle, _MigDevice):
            return f"{gpu.name} MIG {gpu.migs[handle.slot].profile}"
        return gpu.name

    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        memory = pynvml.c_nvmlMemory_t()
        memory.total = gpu.memory_mib * 1024 * 1024
        memory.used = 0
        memory.free = memory.total
        return memory

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetPciInfo")
        return _pci_info(gpu.bus_id)

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        gpu = self._gpu(handle, "nvmlDeviceGetMinorNumber")
        if gpu.minor_number is None:
            raise pynvml.NVMLError_NotSupported()
        return gpu.minor_number

    def nvmlDeviceGetMemoryAffinity(self, handle: Any, nodeSetSize: int, scope: int) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryAffinity")
        return _mask(nodeSetSize, () if gpu.numa_node is None else (gpu.numa_node,))

    def nvmlDeviceGetCpuAffinity(self, handle: Any, cpuSetSize: int) -> Any:
        return _mask(cpuSetSize, self._gpu(handle, "nvmlDeviceGetCpuAffinity").cpus)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: Any, device2: Any) -> int:
        self._gpu(device1, "nvmlDeviceGetTopologyCommonAncestor")
        self._gpu(device2, "nvmlDeviceGetTopologyCommonAncestor")
        level: int = self.pcie[device1.index][device2.index]
        return level

    # -- NVLink ----------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        return int(self._link(device, link, "nvmlDeviceGetNvLinkState").active)

    def nvmlDeviceGetNvLinkVersion(self, device: Any, link: int) -> int:
        return self._link(device, link, "nvmlDeviceGetNvLinkVersion").version

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: Any, link: int) -> int:
        return self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").remote_type

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: Any, link: int) -> Any:
        found = self._link(device, link, "nvmlDeviceGetNvLinkRemotePciInfo")
        if not found.active:
            raise pynvml.NVMLError_NotSupported()  # nothing answers at the far end
        return _pci_info(found.remote_bus_id)

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[tuple[int, int]]) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetFieldValues")
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for slot, (field_id, scope) in zip(values, fieldIds, strict=True):
            slot.fieldId, slot.scopeId = field_id, scope
            found = self._field(gpu, field_id, scope)
            if found is None:
                slot.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            slot.value.ullVal = found
        return values

    def _field(self, gpu: FakeGpu, field_id: int, scope: int) -> int | None:
        """A field's value, as NVML gives it; None where the field is not offered."""
        if field_id in self.unsupported_fields:
            return None
        throughput = {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: "tx_kib",
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: "rx_kib",
        }
        if field_id in throughput:
            link, name = scope, throughput[field_id]
        elif field_id in _LINK_ERROR_FIELDS:
            name, link = _LINK_ERROR_FIELDS[field_id]
        else:
            return None
        if not 0 <= link < len(gpu.links) or not gpu.links[link].active:
            return None
        found = gpu.links[link]
        if name in ("tx_kib", "rx_kib"):  # a busy link: its counters move between reads
            setattr(found, name, getattr(found, name) + self.traffic_kib)
        value: int = getattr(found, name)
        return value

    # -- fabric and C2C --------------------------------------------------------

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetGpuFabricInfoV")
        fabric = gpu.fabric
        if fabric is None:
            raise pynvml.NVMLError_NotSupported()
        states = {
            "not_supported": pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
            "not_started": pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
            "in_progress": pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
            "completed": pynvml.NVML_GPU_FABRIC_STATE_COMPLETED,
        }
        raw = uuidlib.UUID(fabric.cluster_uuid).bytes
        ctypes.memmove(gpuFabricInfo.clusterUuid, raw, len(raw))
        gpuFabricInfo.status = pynvml.NVML_SUCCESS
        gpuFabricInfo.cliqueId = fabric.clique_id
        gpuFabricInfo.state = states[fabric.state]
        gpuFabricInfo.healthMask = 0
        if hasattr(gpuFabricInfo, "healthSummary"):
            gpuFabricInfo.healthSummary = (
                pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY
                if fabric.healthy
                else pynvml.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
            )
        return int(pynvml.NVML_SUCCESS)

    def nvmlDeviceGetC2cModeInfoV(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "nvmlDeviceGetC2cModeInfoV")
        info = pynvml.c_nvmlC2cModeInfo_v1_t()
        info.isC2cEnabled = int(gpu.c2c)
        return info

    # -- MIG ---------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.mig_enabled else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: Any) -> int:
        gpu = self._gpu(device, "nvmlDeviceGetMaxMigDeviceCount")
        return MAX_MIG_DEVICES if gpu.mig_enabled else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: Any, index: int) -> Any:
        gpu = self._gpu(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig_enabled:
            raise pynvml.NVMLError_NotSupported()
        if not 0 <= index < MAX_MIG_DEVICES:
            raise pynvml.NVMLError_InvalidArgument()
        if index >= len(gpu.migs):
            raise pynvml.NVMLError_NotFound()
        return _MigDevice(device.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device: Any) -> int:
        if not isinstance(device, _MigDevice):
            self._gpu(device, "nvmlDeviceGetGpuInstanceId")
            raise pynvml.NVMLError_InvalidArgument()  # only MIG devices belong to an instance
        return self._mig(device, "nvmlDeviceGetGpuInstanceId").gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, device: Any) -> int:
        if not isinstance(device, _MigDevice):
            self._gpu(device, "nvmlDeviceGetComputeInstanceId")
            raise pynvml.NVMLError_InvalidArgument()
        return self._mig(device, "nvmlDeviceGetComputeInstanceId").compute_instance_id

    def nvmlDeviceGetGpuInstanceById(self, device: Any, gpuInstanceId: int) -> Any:
        gpu = self._gpu(device, "nvmlDeviceGetGpuInstanceById")
        if not any(m.gpu_instance_id == gpuInstanceId for m in gpu.migs):
            raise pynvml.NVMLError_NotFound()
        return _GpuInstance(device.index, gpuInstanceId)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> Any:
        gpu = self._gpu(_Device(gpuInstance.parent), "nvmlGpuInstanceGetInfo")
        mig = next(m for m in gpu.migs if m.gpu_instance_id == gpuInstance.instance_id)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id = mig.gpu_instance_id
        info.profileId = MIG_PROFILES[mig.profile][1]
        info.placement.start = mig.start
        info.placement.size = mig.size
        return info

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, device: Any, profile: int, version: int = 2
    ) -> Any:
        self._gpu(device, "nvmlDeviceGetGpuInstanceProfileInfo")
        if not 0 <= profile < pynvml.NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise pynvml.NVMLError_InvalidArgument()
        for name, (index, profile_id) in MIG_PROFILES.items():
            if index == profile:
                info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
                info.id = profile_id
                info.sliceCount = int(name.split("g.")[0])
                info.memorySizeMB = int(name.split(".")[1].removesuffix("gb")) * 1024
                info.name = f"MIG {name}".encode()
                return info
        raise pynvml.NVMLError_NotSupported()


def _pci_info(bus_id: str) -> Any:
    info = pynvml.nvmlPciInfo_t()
    info.busId = bus_id.encode()
    try:
        domain, bus, rest = bus_id.split(":")
        info.busIdLegacy = f"{int(domain, 16):04X}:{bus}:{rest}".encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
    except ValueError:
        pass  # an address a driver garbled: the text as it is, the numbers left at 0
    return info


def _mask(words: int, bits: tuple[int, ...]) -> Any:
    mask = (ctypes.c_ulonglong * words)()
    for bit in bits:
        if bit < 64 * words:
            mask[bit // 64] |= 1 << (bit % 64)
    return mask


def _switch_bus_id(switch: int) -> str:
    return f"00000000:{0xC1 + switch:02X}:00.0"


def _wire_nvlinks(snap: NodeSnapshot, gpus: list[FakeGpu]) -> None:
    n = snap.gpu_count
    for i in range(n):
        version = _NVLINK_VERSION.get(gpu_family(gpus[i].name), 3)
        switched = 0
        for j in range(n):
            link = parse_link(snap.links[i][j])
            if link.kind is LinkKind.NVLINK:
                gpus[i].links += [
                    FakeLink(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, gpus[j].bus_id, version=version)
                    for _ in range(link.lanes)
                ]
            elif link.kind is LinkKind.NVSWITCH:
                switched = max(switched, link.lanes)
        gpus[i].links += [
            FakeLink(
                pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH,
                _switch_bus_id(k % SWITCHES),
                version=version,
            )
            for k in range(switched)
        ]


def _pcie_level(snap: NodeSnapshot, i: int, j: int) -> int:
    if i == j:
        return int(pynvml.NVML_TOPOLOGY_INTERNAL)
    link = parse_link(snap.links[i][j])
    if link.kind in _PCIE_LEVELS:
        return int(_PCIE_LEVELS[link.kind])
    same = snap.gpus[i].numa_node is not None and snap.gpus[i].numa_node == snap.gpus[j].numa_node
    return int(pynvml.NVML_TOPOLOGY_NODE if same else pynvml.NVML_TOPOLOGY_SYSTEM)


def fake_host(snap: NodeSnapshot) -> StaticHost:
    """The host around ``snap``'s GPUs: its ISA, NUMA nodes and NICs."""
    return StaticHost(
        HostFacts(
            hostname=snap.hostname or snap.name,
            cpu_isa=snap.cpu_isa,
            numa_nodes=tuple(snap.numa_nodes),
        ),
        tuple(snap.nics),
        {sysfs_bus_id(g.pci_bus_id): g.numa_node for g in snap.gpus if g.numa_node is not None},
    )
