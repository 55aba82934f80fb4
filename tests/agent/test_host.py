"""Host facts from a made-up /sys tree: NUMA nodes, device NUMA nodes, RDMA NICs' PCIe relations."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host import HostError, SysfsHost, cpu_isa, sysfs_bus_id
from placement.text import forbidden_character

# Socket 0 has one root complex: a PCIe switch holding GPU 0
# and mlx5_0 side by side, behind it a second switch level holding GPU 1;
# a GPU 2 on another root port of the same root complex. Socket 1: GPU 3 and
# mlx5_1 on two root complexes of the second NUMA node.
DEVICES = {
    "0000:18:00.0": ("pci0000:17", "0000:17:00.0", "0000:18:00.0"),
    "0000:19:00.0": ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:19:00.0"),
    "0000:1a:00.0": ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:1a:00.0"),
    "0000:1b:00.0": ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:1b:00.0"),
    "0000:1c:00.0": ("pci0000:17", "0000:17:00.0", "0000:18:00.0", "0000:1b:00.0", "0000:1c:00.0"),
    "0000:1d:00.0": (
        "pci0000:17",
        "0000:17:00.0",
        "0000:18:00.0",
        "0000:1b:00.0",
        "0000:1c:00.0",
        "0000:1d:00.0",
    ),
    "0000:2a:00.0": ("pci0000:17", "0000:17:02.0", "0000:2a:00.0"),
    "0000:9a:00.0": ("pci0000:99", "0000:99:00.0", "0000:9a:00.0"),
    "0000:9b:00.0": ("pci0000:98", "0000:98:00.0", "0000:9b:00.0"),
}
GPUS = ["00000000:1A:00.0", "00000000:1D:00.0", "00000000:2A:00.0", "00000000:9A:00.0"]
NICS = {"mlx5_0": "0000:19:00.0", "mlx5_1": "0000:9b:00.0"}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    sys_dir = tmp_path / "sys"
    for bus_id, parts in DEVICES.items():
        device = sys_dir.joinpath("devices", *parts)
        device.mkdir(parents=True)
        (device / "numa_node").write_text("0\n" if parts[0] == "pci0000:17" else "1\n")
        link = sys_dir / "bus/pci/devices" / bus_id
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(device)
    for name, bus_id in NICS.items():
        (sys_dir / "class/infiniband" / name).mkdir(parents=True)
        (sys_dir / "class/infiniband" / name / "device").symlink_to(
            sys_dir / "bus/pci/devices" / bus_id
        )
    nodes = sys_dir / "devices/system/node"
    for node, cpus, kib in (
        ("node0", "0-15,32-47", 65_536_000),
        ("node1", "16-31,48-63", 65_536_000),
        ("node2", "", 98_000_000),
    ):
        (nodes / node).mkdir(parents=True)
        (nodes / node / "cpulist").write_text(cpus + "\n")
        (nodes / node / "meminfo").write_text(
            f"Node {node[-1]} MemTotal:       {kib} kB\nNode {node[-1]} MemFree: 1 kB\n"
        )
    (nodes / "possible").write_text("0-2\n")
    return tmp_path


def test_numa_nodes_with_cpus_and_memory(root: Path) -> None:
    facts = SysfsHost(root, machine="x86_64").facts()
    assert [(n.id, n.cpus, n.memory_mib) for n in facts.numa_nodes] == [
        (0, "0-15,32-47", 64000),
        (1, "16-31,48-63", 64000),
    ]  # node2 has memory but no CPUs: GPU memory on a coherent system, not a CPU node
    assert facts.cpu_isa == "x86_64" and facts.hostname


def test_device_numa_node_from_its_pci_address(root: Path) -> None:
    host = SysfsHost(root)
    assert host.device_numa_node("00000000:9A:00.0") == 1
    assert host.device_numa_node("00000000:FF:00.0") is None


def test_nic_relations_follow_the_pci_tree(root: Path) -> None:
    nics = SysfsHost(root).nics(GPUS)
    assert [n.name for n in nics] == ["mlx5_0", "mlx5_1"]
    assert nics[0].links == ["PIX", "PXB", "PHB", "SYS"]
    assert nics[1].links == ["SYS", "SYS", "SYS", "NODE"]


def test_no_nics_when_a_gpu_is_not_in_the_tree(root: Path) -> None:
    assert SysfsHost(root).nics([*GPUS, "00000000:EE:00.0"]) == []


def test_a_host_without_sysfs_has_no_numa_nodes_and_no_nics(tmp_path: Path) -> None:
    host = SysfsHost(tmp_path, machine="aarch64")
    assert host.facts().numa_nodes == () and host.nics(GPUS) == []


def test_cpu_isa_names() -> None:
    assert (
        cpu_isa("arm64") == "aarch64"
        and cpu_isa("AMD64") == "x86_64"
        and cpu_isa("riscv64") == "riscv64"
    )
    with pytest.raises(HostError, match="ppc64le"):
        cpu_isa("ppc64le")


def test_sysfs_bus_id() -> None:
    assert sysfs_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert sysfs_bus_id("00000008:01:00.0") == "0008:01:00.0"


@pytest.mark.parametrize("name", ["gpu-07\udcff", "gpu-07\x1b[2J", "g" * 300])
def test_a_host_name_no_snapshot_can_carry_is_escaped_not_a_failed_round(
    root: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # A name set with non-UTF-8 bytes comes back from Python with lone surrogates, which
    # the snapshot refuses like control characters: every round would fail.
    monkeypatch.setattr("agent.host.socket.gethostname", lambda: name)
    hostname = SysfsHost(root, machine="x86_64").facts().hostname
    assert hostname.startswith("g") and forbidden_character(hostname) is None
    assert len(hostname) <= 253
