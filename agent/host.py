"""What the host itself says: CPU ISA, NUMA nodes and their CPUs, RDMA NICs, from /sys.

NVML knows GPUs only; the CPUs, memory nodes and NICs around them come from
the kernel. ``SysfsHost`` reads them under a root directory (``/`` on a
node, a made-up tree in tests). ``StaticHost`` serves fixed facts, for the
simulated sources and for tests that pair it with the NVML fake.

NIC relations follow what ``nvidia-smi topo -m`` prints, computed from the
PCI paths under ``/sys/devices``: both devices under one PCIe switch (at most
a downstream port and the switch's upstream port between them) is ``PIX``,
deeper trees are ``PXB``, the same root complex is ``PHB``, different root
complexes on one NUMA node ``NODE``, otherwise ``SYS``. Only RDMA devices
(``/sys/class/infiniband``) are listed: they are the NICs GPUDirect uses.
"""

from __future__ import annotations

import platform
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from placement.cpuset import CpusetError, parse_cpuset
from placement.snapshot import CpuIsa, Nic, NumaNode
from placement.text import forbidden_character

_ISA_ALIASES: dict[str, CpuIsa] = {
    "x86_64": "x86_64",
    "amd64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "riscv64": "riscv64",
}
_NODE_DIR_RE = re.compile(r"^node(\d+)$")
_MEMTOTAL_RE = re.compile(r"MemTotal:\s+(\d+)\s+kB")
_BUS_ID_RE = re.compile(r"^([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$")


class HostError(RuntimeError):
    """A host fact the agent cannot do without (the CPU ISA) is unknown."""


def cpu_isa(machine: str | None = None) -> CpuIsa:
    """The snapshot's name for this machine's CPU architecture."""
    name = (machine if machine is not None else platform.machine()).lower()
    try:
        return _ISA_ALIASES[name]
    except KeyError:
        raise HostError(
            f"CPU architecture {name!r} is not one topoplace knows (x86_64, aarch64, riscv64)"
        ) from None


def sysfs_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as Linux names the device: ``0000:18:00.0``."""
    match = _BUS_ID_RE.match(bus_id.strip())
    if match is None:
        return bus_id.strip().lower()
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


@dataclass(frozen=True)
class HostFacts:
    hostname: str
    cpu_isa: CpuIsa
    numa_nodes: tuple[NumaNode, ...] = ()


class Host(Protocol):
    def facts(self) -> HostFacts: ...
    def device_numa_node(self, bus_id: str) -> int | None: ...
    def nics(self, gpu_bus_ids: Sequence[str]) -> list[Nic]: ...


@dataclass(frozen=True)
class StaticHost:
    """Fixed host facts (simulated nodes, tests)."""

    host: HostFacts
    nic_list: tuple[Nic, ...] = ()
    numa_of_device: dict[str, int] = field(default_factory=dict)

    def facts(self) -> HostFacts:
        return self.host

    def device_numa_node(self, bus_id: str) -> int | None:
        return self.numa_of_device.get(sysfs_bus_id(bus_id))

    def nics(self, gpu_bus_ids: Sequence[str]) -> list[Nic]:
        return [nic for nic in self.nic_list if len(nic.links) == len(gpu_bus_ids)]


class SysfsHost:
    """Host facts read from a Linux /sys tree under ``root``."""

    def __init__(self, root: Path = Path("/"), *, machine: str | None = None) -> None:
        self.root = root
        self.machine = machine

    def facts(self) -> HostFacts:
        return HostFacts(
            hostname=_hostname(),
            cpu_isa=cpu_isa(self.machine),
            numa_nodes=tuple(self._numa_nodes()),
        )

    def _numa_nodes(self) -> list[NumaNode]:
        base = self.root / "sys/devices/system/node"
        nodes: list[NumaNode] = []
        for entry in sorted(_listdir(base), key=_node_number):
            match = _NODE_DIR_RE.match(entry)
            if match is None:
                continue
            cpus = _read(base / entry / "cpulist") or ""
            try:
                if not parse_cpuset(cpus):
                    # A node without CPUs is memory only: on Grace systems each
                    # GPU's own memory shows up as one. GPUs belong to CPU nodes.
                    continue
            except CpusetError:
                continue
            memory = _MEMTOTAL_RE.search(_read(base / entry / "meminfo") or "")
            memory_mib = int(memory.group(1)) // 1024 if memory else 0
            nodes.append(NumaNode(id=int(match.group(1)), cpus=cpus.strip(), memory_mib=memory_mib))
        return nodes

    def device_numa_node(self, bus_id: str) -> int | None:
        text = _read(self.root / "sys/bus/pci/devices" / sysfs_bus_id(bus_id) / "numa_node")
        if text is None or not text.strip().lstrip("-").isdigit():
            return None
        node = int(text)
        return node if node >= 0 else None

    def nics(self, gpu_bus_ids: Sequence[str]) -> list[Nic]:
        base = self.root / "sys/class/infiniband"
        gpu_paths = [self._pci_path(sysfs_bus_id(b)) for b in gpu_bus_ids]
        if any(path is None for path in gpu_paths):
            return []  # without every GPU's place in the tree, no NIC relation is right
        nics: list[Nic] = []
        for name in sorted(_listdir(base)):
            try:
                device = (base / name / "device").resolve(strict=True)
            except OSError:
                continue
            nic_path = self._relative(device)
            if nic_path is None:
                continue
            nic_numa = self.device_numa_node(nic_path[-1])
            links = [
                self._relation(nic_path, nic_numa, path, self.device_numa_node(path[-1]))
                for path in gpu_paths
                if path is not None
            ]
            nics.append(Nic(name=name[:64], links=links))
        return nics

    def _pci_path(self, bus_id: str) -> tuple[str, ...] | None:
        try:
            device = (self.root / "sys/bus/pci/devices" / bus_id).resolve(strict=True)
        except OSError:
            return None
        return self._relative(device)

    def _relative(self, device: Path) -> tuple[str, ...] | None:
        """The device's path below /sys/devices: root complex, bridges, the device."""
        try:
            parts = device.relative_to((self.root / "sys/devices").resolve()).parts
        except ValueError:
            return None
        return parts if parts and parts[0].startswith("pci") else None

    @staticmethod
    def _relation(
        a: tuple[str, ...], numa_a: int | None, b: tuple[str, ...], numa_b: int | None
    ) -> str:
        if a[0] != b[0]:
            return "NODE" if numa_a is not None and numa_a == numa_b else "SYS"
        common = 0
        while common < min(len(a), len(b)) - 1 and a[common] == b[common]:
            common += 1
        if common <= 1:
            return "PHB"  # they meet only at the root complex
        below = max(len(a), len(b)) - common
        return "PIX" if below <= 2 else "PXB"


def _hostname() -> str:
    """The host name as a snapshot carries it: at most 253 characters, control characters
    and the lone surrogates of non-UTF-8 bytes escaped, so an odd name set on the machine
    does not fail every round."""
    name = socket.gethostname()
    if forbidden_character(name) is not None:
        name = name.encode("unicode_escape", "backslashreplace").decode("ascii")
    return name[:253]


def _node_number(entry: str) -> int:
    match = _NODE_DIR_RE.match(entry)
    return int(match.group(1)) if match else -1


def _listdir(path: Path) -> list[str]:
    try:
        return [p.name for p in path.iterdir()]
    except OSError:
        return []


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
