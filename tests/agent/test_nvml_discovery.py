"""NVML discovery against the in-memory NVML: every machine kind, and every way a driver fails."""

from __future__ import annotations

from typing import Any

import pynvml
import pytest

from agent.nvml_api import NvmlUnavailable, load_nvml
from agent.nvml_discovery import DiscoveryError, unreadable_uuid
from agent.nvml_fake import FakeNvml, fake_host
from agent.sources import Identity, NvmlSource
from placement import Health, NodeSnapshot
from placement.profiles import build_profile, profile_names
from placement.snapshot import Fabric


def _source(profile: str, name: str = "n1") -> tuple[FakeNvml, NvmlSource, NodeSnapshot]:
    snap = build_profile(profile, name)
    fake = FakeNvml.from_snapshot(snap)
    fake.nvmlInit()
    return fake, NvmlSource(fake, fake_host(snap), Identity(name)), snap


@pytest.mark.parametrize("profile", profile_names())
def test_discovery_reproduces_every_profile(profile: str) -> None:
    _, source, snap = _source(profile)
    got = source.read()
    # C2C bandwidth is the profile's published figure; NVML does not report it.
    exclude = {"timestamp", "cpu_links"}
    expected = snap.model_dump(exclude=exclude)
    for gpu in expected["gpus"]:  # the fake's driver numbers device files as NVML's order
        gpu["minor_number"] = gpu["index"]
    assert got.model_dump(exclude=exclude) == expected
    assert [(c.gpu, c.kind) for c in got.cpu_links] == [(c.gpu, c.kind) for c in snap.cpu_links]


def test_dgx1_mesh_counts_direct_links_per_pair() -> None:
    _, source, _ = _source("dgx1-v100")
    links = source.read().links
    assert links[0][3] == "NV2" and links[0][1] == "NV1"
    assert links[0][5] == "SYS"  # no NVLink between them: PCIe across sockets
    assert not any(label.startswith("NVS") for row in links for label in row)


def test_nvswitch_box_is_connected_through_the_switch() -> None:
    fake, source, _ = _source("hgx-h100")
    # Every NVLink ends at a switch: a GPU-to-GPU search would find nothing.
    assert {link.remote_type for gpu in fake.gpus for link in gpu.links} == {
        pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    }
    links = source.read().links
    assert all(links[i][j] == "NVS18" for i in range(8) for j in range(8) if i != j)


def test_nvswitch_found_by_address_when_the_driver_cannot_say_the_remote_type() -> None:
    fake, source, _ = _source("dgx-a100")
    for index in range(8):
        fake.fail("nvmlDeviceGetNvLinkRemoteDeviceType", index, pynvml.NVMLError_NotSupported)
    assert source.read().links[0][7] == "NVS12"


def test_pcie_box_reports_common_ancestors() -> None:
    _, source, snap = _source("pcie-8x-l40s")
    got = source.read()
    assert got.links == snap.links
    assert {label for row in got.links for label in row} == {"X", "NODE", "SYS"}


def test_mig_instances_with_profiles_and_placements() -> None:
    _, source, snap = _source("hgx-h100-mig")
    got = source.read()
    assert all(g.mig_enabled for g in got.gpus)
    on_gpu3 = [
        (m.profile, m.placement_start, m.placement_size)
        for m in got.mig_instances
        if m.parent_gpu == 3
    ]
    assert on_gpu3 == [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)]
    assert [m.uuid for m in got.mig_instances] == [m.uuid for m in snap.mig_instances]


def test_gb200_tray_fabric_c2c_and_arm_host() -> None:
    _, source, snap = _source("gb200-tray")
    got = source.read()
    assert got.cpu_isa == "aarch64"
    assert got.fabric == snap.fabric and got.fabric_domain() == snap.fabric_domain()
    assert {c.kind for c in got.cpu_links} == {"nvlink-c2c"}


def test_fabric_registration_in_progress_is_reported_but_not_trusted() -> None:
    snap = build_profile("gb200-tray", "t1")
    fabric = snap.fabric
    assert fabric is not None
    pending = snap.model_copy(update={"fabric": fabric.model_copy(update={"state": "in_progress"})})
    fake = FakeNvml.from_snapshot(pending)
    fake.nvmlInit()
    got = NvmlSource(fake, fake_host(pending), Identity("t1")).read()
    assert got.fabric is not None and got.fabric.state == "in_progress"
    assert got.fabric_domain() is None


def test_gpu_lost_mid_run_marks_only_that_gpu() -> None:
    fake, source, _ = _source("hgx-h100")
    before = source.read()
    fake.lose_gpu(3)
    after = source.read()
    lost = after.gpus[3]
    assert lost.health is Health.UNHEALTHY and "GPU is lost" in lost.health_reason
    # It keeps the identity it had, so allocations on it can be found.
    assert lost.uuid == before.gpus[3].uuid and lost.pci_bus_id == before.gpus[3].pci_bus_id
    assert all(g.health is Health.HEALTHY for g in after.gpus if g.index != 3)
    assert after.links[0][1] == "NVS18" and after.links[0][3] == "SYS"


def test_gpu_lost_before_the_first_read_still_gives_a_valid_snapshot() -> None:
    fake, source, _ = _source("pcie-8x-l40s")
    fake.lose_gpu(0)
    got = source.read()
    assert got.gpus[0].health is Health.UNHEALTHY
    assert got.gpus[0].uuid == unreadable_uuid("n1", 0)
    assert got.gpu_count == 8


def test_a_link_down_lowers_the_pair_and_the_switch_count() -> None:
    fake, source, _ = _source("hgx-h100")
    fake.set_link_active(2, 5, False)
    links = source.read().links
    assert links[2][0] == links[0][2] == "NVS17"
    assert links[0][1] == "NVS18"


def test_mesh_link_down_falls_back_to_remaining_lanes_then_pcie() -> None:
    fake, source, snap = _source("dgx1-v100")
    nv2 = [
        k
        for k, link in enumerate(fake.gpus[0].links)
        if link.remote_bus_id == snap.gpus[3].pci_bus_id
    ]
    nv1 = [
        k
        for k, link in enumerate(fake.gpus[0].links)
        if link.remote_bus_id == snap.gpus[1].pci_bus_id
    ]
    fake.set_link_active(0, nv2[0], False)
    fake.set_link_active(0, nv1[0], False)
    links = source.read().links
    assert links[0][3] == "NV1"
    assert links[0][1] == "NODE"  # no NVLink left: the PCIe relation


def test_a_failing_link_is_not_counted_and_is_named() -> None:
    fake, source, _ = _source("hgx-h100")
    fake.fail_link(4, 0, pynvml.NVMLError_Unknown)
    got = source.read()
    assert got.links[4][0] == "NVS17"
    assert got.gpus[4].health is Health.HEALTHY
    assert "NVLink 0 unhealthy" in got.gpus[4].health_reason


def test_no_permission_for_an_optional_fact_keeps_the_gpu() -> None:
    fake, source, snap = _source("hgx-h100")
    fake.fail("nvmlDeviceGetMemoryAffinity", 5, pynvml.NVMLError_NoPermission)
    got = source.read()
    assert got.gpus[5].health is Health.HEALTHY
    assert got.gpus[5].numa_node == snap.gpus[5].numa_node  # from the CPU affinity instead
    assert "Insufficient Permissions" in got.gpus[5].health_reason


def test_no_permission_for_what_the_gpu_is_makes_it_unhealthy() -> None:
    fake, source, _ = _source("hgx-h100")
    fake.fail("nvmlDeviceGetMemoryInfo", 1, pynvml.NVMLError_NoPermission)
    got = source.read()
    assert got.gpus[1].health is Health.UNHEALTHY
    assert "Insufficient Permissions" in got.gpus[1].health_reason


def test_unknown_mig_mode_is_unsafe() -> None:
    fake, source, _ = _source("dgx-a100-mig")
    fake.fail("nvmlDeviceGetMigMode", 0, pynvml.NVMLError_Unknown)
    got = source.read()
    assert got.gpus[0].health is Health.UNHEALTHY
    assert not any(m.parent_gpu == 0 for m in got.mig_instances)


def test_fabric_not_supported_means_no_fabric() -> None:
    fake, source, _ = _source("gb200-tray")
    for index in range(4):
        fake.fail("nvmlDeviceGetGpuFabricInfoV", index, pynvml.NVMLError_NotSupported)
    got = source.read()
    assert got.fabric is None and got.gpus[0].health_reason == ""


def test_nvml_failing_as_a_whole_is_a_discovery_error() -> None:
    fake, source, _ = _source("hgx-h100")
    fake.nvmlShutdown()
    with pytest.raises(DiscoveryError, match="Uninitialized"):
        source.read()


def test_nvml_absent_is_a_clear_startup_error() -> None:
    fake = FakeNvml.from_snapshot(build_profile("hgx-h100", "n1"), available=False)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()
    try:
        real = load_nvml()
    except NvmlUnavailable as exc:  # this machine has no NVIDIA driver
        assert "--source smi:FILE" in str(exc) and "NVML cannot be initialised" in str(exc)
    else:
        assert real.nvmlDeviceGetCount() >= 0
        real.nvmlShutdown()


def test_gpus_lost_before_the_first_read_on_two_nodes_have_different_placeholders() -> None:
    # The service refuses a device UUID that another node lists (409), so a placeholder
    # shared by every node with a lost GPU 0 would hide the second node's healthy GPUs.
    fake_a, source_a, _ = _source("pcie-8x-l40s", "node-a")
    fake_b, source_b, _ = _source("pcie-8x-l40s", "node-b")
    fake_a.lose_gpu(0)
    fake_b.lose_gpu(0)
    a, b = source_a.read(), source_b.read()
    assert a.gpus[0].uuid.startswith("GPU-unreadable-0")
    assert a.device_uuids.isdisjoint(b.device_uuids), (a.gpus[0].uuid, b.gpus[0].uuid)
    assert source_a.read().gpus[0].uuid == a.gpus[0].uuid  # the same every round


@pytest.mark.parametrize(
    "function", ["nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex"]
)
def test_mig_enumeration_failing_leaves_the_gpus_instances_out_and_the_node_reported(
    function: str,
) -> None:
    fake, source, snap = _source("hgx-h100-mig")
    fake.fail(function, 3, pynvml.NVMLError_NoPermission)
    got = source.read()
    assert not any(m.parent_gpu == 3 for m in got.mig_instances)
    assert "Insufficient Permissions" in got.gpus[3].health_reason
    others = [m.uuid for m in snap.mig_instances if m.parent_gpu != 3]
    assert [m.uuid for m in got.mig_instances] == others


@pytest.mark.parametrize(
    ("field", "value"),
    [("name", "NVIDIA H100 80GB HBM3\x1b[2J"), ("name", ""), ("uuid", "GPU-" + "f" * 200)],
)
def test_a_gpu_naming_itself_in_an_unusable_string_is_unhealthy_not_a_failed_round(
    field: str, value: str
) -> None:
    fake, source, _ = _source("hgx-h100")
    setattr(fake.gpus[2], field, value)
    got = source.read()
    assert got.gpus[2].health is Health.UNHEALTHY
    assert "nvmlDeviceGet" in got.gpus[2].health_reason
    assert all(g.health is Health.HEALTHY for g in got.gpus if g.index != 2)


def test_a_mig_device_with_an_unusable_uuid_is_left_out_and_noted() -> None:
    fake, source, snap = _source("hgx-h100-mig")
    odd = fake.gpus[3].migs[0].uuid
    fake.gpus[3].migs[0].uuid = "MIG-\x07"
    got = source.read()
    assert "MIG device 0: nvmlDeviceGetUUID answered 'MIG-\\x07'" in got.gpus[3].health_reason
    assert got.gpus[3].health is Health.HEALTHY
    assert [m.uuid for m in got.mig_instances] == [
        m.uuid for m in snap.mig_instances if m.uuid != odd
    ]


def test_a_gpu_name_pynvml_cannot_decode_is_unhealthy_not_a_failed_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, source, _ = _source("hgx-h100")
    real = fake.nvmlDeviceGetName

    def name(handle: object) -> str:
        if getattr(handle, "index", None) == 6:
            return b"NVIDIA \xff\xfe".decode()  # what pynvml's convertStrBytes does
        return real(handle)

    monkeypatch.setattr(fake, "nvmlDeviceGetName", name)
    got = source.read()
    assert got.gpus[6].health is Health.UNHEALTHY
    assert "not UTF-8" in got.gpus[6].health_reason
    assert got.gpus[5].health is Health.HEALTHY


def test_a_driver_version_no_snapshot_can_carry_is_left_out() -> None:
    fake, source, _ = _source("hgx-h100")
    fake.driver_version = "570.124.06\x00\x1b" + "9" * 80
    got = source.read()
    assert got.driver_version is None and got.gpu_count == 8


def test_links_to_a_lost_gpu_are_not_taken_for_a_switch_where_the_remote_type_is_unknown() -> None:
    # An older driver cannot say a link's remote type, so an address that is none of the
    # node's GPUs is taken for an NVSwitch; a lost GPU's address must still count as a GPU,
    # or two GPUs that each link to it would be reported joined through a switch.
    fake, source, snap = _source("dgx1-v100")
    source.read()
    for index in range(8):
        fake.fail("nvmlDeviceGetNvLinkRemoteDeviceType", index, pynvml.NVMLError_NotSupported)
    fake.lose_gpu(3)
    got = source.read()
    assert not any(label.startswith("NVS") for row in got.links for label in row), got.links
    healthy = [i for i in range(8) if i != 3]
    assert all(got.links[i][j] == snap.links[i][j] for i in healthy for j in healthy)


def test_a_lost_gpu_never_takes_the_identity_another_gpu_reports_after_the_count_shrank() -> None:
    # GPU 2 leaves the enumeration (the count drops to 7, the GPUs after it move up one
    # index) while the GPU now at index 5 is lost: the identity index 5 had last time is
    # the GPU now at index 4, which says so itself.
    fake, source, snap = _source("pcie-8x-l40s")
    source.read()
    del fake.gpus[2]
    fake.lose_gpu(5)
    got = source.read()
    assert got.gpu_count == 7
    assert got.gpus[4].uuid == snap.gpus[5].uuid and got.gpus[4].health is Health.HEALTHY
    assert got.gpus[5].health is Health.UNHEALTHY
    assert got.gpus[5].uuid not in {g.uuid for g in got.gpus if g.index != 5}


def test_a_fabric_clique_id_past_what_a_snapshot_carries_leaves_the_fabric_out() -> None:
    # NVML's clique id is an unsigned 32-bit number; a snapshot's counts stop at 2^31 - 1.
    fake, source, _ = _source("gb200-tray")
    fabric = fake.gpus[1].fabric
    assert fabric is not None
    fake.gpus[1].fabric = Fabric.model_construct(**{**fabric.model_dump(), "clique_id": 2**32 - 1})
    got = source.read()
    assert got.gpus[1].health is Health.HEALTHY and "fabric" in got.gpus[1].health_reason
    assert got.fabric == fabric  # the other GPUs still say which domain the node is in


def test_a_gpu_memory_size_past_what_a_snapshot_carries_makes_it_unhealthy() -> None:
    fake, source, _ = _source("hgx-h100")
    fake.gpus[4].memory_mib = 2**40  # a garbage total: 1 ZiB
    got = source.read()
    assert got.gpus[4].health is Health.UNHEALTHY
    assert "nvmlDeviceGetMemoryInfo" in got.gpus[4].health_reason
    assert got.gpus[4].memory_mib == 0 and got.gpus[3].health is Health.HEALTHY


def _undecodable_bus_id() -> Any:
    """A PCI info whose bus id is not UTF-8: pynvml raises on reading the field."""
    info = pynvml.nvmlPciInfo_t()
    info.busId = b"0000\xff:18:00.0"
    return info


def test_a_pci_bus_id_that_is_not_utf8_makes_the_gpu_unhealthy_not_a_failed_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, source, _ = _source("hgx-h100")
    real = fake.nvmlDeviceGetPciInfo
    monkeypatch.setattr(
        fake,
        "nvmlDeviceGetPciInfo",
        lambda handle: _undecodable_bus_id() if handle.index == 2 else real(handle),
    )
    got = source.read()
    assert got.gpus[2].health is Health.UNHEALTHY and "not UTF-8" in got.gpus[2].health_reason
    assert got.gpus[3].health is Health.HEALTHY


def test_an_nvlink_remote_bus_id_that_is_not_utf8_leaves_that_link_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, source, snap = _source("dgx1-v100")
    real = fake.nvmlDeviceGetNvLinkRemotePciInfo

    def remote(handle: Any, link: int) -> Any:
        if handle.index == 0 and link == 0:
            return _undecodable_bus_id()
        return real(handle, link)

    monkeypatch.setattr(fake, "nvmlDeviceGetNvLinkRemotePciInfo", remote)
    got = source.read()
    assert got.gpus[0].health is Health.HEALTHY
    assert "NVLink 0 unhealthy" in got.gpus[0].health_reason
    assert got.links[2][3] == snap.links[2][3]


def test_a_mig_profile_name_that_is_not_utf8_falls_back_to_the_device_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, source, snap = _source("hgx-h100-mig")
    real = fake.nvmlDeviceGetGpuInstanceProfileInfo

    def profile(device: Any, index: int, version: int = 2) -> Any:
        info = real(device, index, version)
        if device.index == 3:
            info.name = b"MIG \xff"
        return info

    monkeypatch.setattr(fake, "nvmlDeviceGetGpuInstanceProfileInfo", profile)
    got = source.read()
    assert [m.profile for m in got.mig_instances] == [m.profile for m in snap.mig_instances]


def test_a_driver_that_knows_only_the_v2_fabric_info_still_gives_the_fabric(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Drivers before the v3 structure (health summary) answer ArgumentVersionMismatch to it.
    fake, source, snap = _source("gb200-tray")
    real = fake.nvmlDeviceGetGpuFabricInfoV

    def fabric_info(device: Any, info: Any) -> int:
        if hasattr(info, "healthSummary"):
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        return real(device, info)

    monkeypatch.setattr(fake, "nvmlDeviceGetGpuFabricInfoV", fabric_info)
    got = source.read()
    assert got.fabric == snap.fabric
    assert all(g.health_reason == "" for g in got.gpus)


@pytest.mark.parametrize(
    "change",
    [{"clique_id": 7}, {"healthy": False}, {"state": "in_progress"}],
    ids=["another-clique", "unhealthy", "registering"],
)
def test_a_node_whose_gpus_disagree_on_the_fabric_is_in_no_domain(
    change: dict[str, Any],
) -> None:
    # The node took its first GPU's fabric: with GPU 2 in another clique, its fabric
    # unhealthy or still registering, the node was reported healthy in GPU 0's clique, and
    # a gang was planned over NVLink to a GPU outside that domain.
    fake, source, snap = _source("gb200-tray")
    fabric = fake.gpus[2].fabric
    assert fabric is not None and snap.fabric_domain() is not None
    fake.gpus[2].fabric = fabric.model_copy(update=change)
    got = source.read()
    assert got.fabric is not None and got.fabric_domain() is None
