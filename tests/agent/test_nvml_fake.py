"""The NVML fake answers in pynvml's own shapes and raises pynvml's own errors."""

from __future__ import annotations

import pynvml
import pytest

from agent.nvml_fake import FakeNvml
from placement.profiles import build_profile


@pytest.fixture
def fake() -> FakeNvml:
    nvml = FakeNvml.from_snapshot(build_profile("dgx-a100-mig", "n1"))
    nvml.nvmlInit()
    return nvml


def test_calls_before_init_raise_uninitialized() -> None:
    nvml = FakeNvml.from_snapshot(build_profile("hgx-h100", "n1"))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()


def test_values_come_in_pynvml_structures(fake: FakeNvml) -> None:
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    memory = fake.nvmlDeviceGetMemoryInfo(handle)
    assert isinstance(memory, pynvml.c_nvmlMemory_t) and memory.total == 81920 * 1024 * 1024
    pci = fake.nvmlDeviceGetPciInfo(handle)
    assert isinstance(pci, pynvml.nvmlPciInfo_t)
    assert (
        isinstance(pci.busId, str)
        and pci.busId == build_profile("dgx-a100", "n1").gpus[0].pci_bus_id
    )
    remote = fake.nvmlDeviceGetNvLinkRemotePciInfo(handle, 0)
    assert isinstance(remote, pynvml.nvmlPciInfo_t)
    assert (
        fake.nvmlDeviceGetNvLinkRemoteDeviceType(handle, 0) == pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
    )
    assert fake.nvmlDeviceGetNvLinkVersion(handle, 0) == 3  # Ampere
    assert fake.nvmlDeviceGetMigMode(handle) == [1, 1]
    assert fake.nvmlSystemGetCudaDriverVersion() == 12080


def test_affinity_masks_are_arrays_of_64_bit_words(fake: FakeNvml) -> None:
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    mask = fake.nvmlDeviceGetCpuAffinity(handle, 4)
    assert len(mask) == 4
    cpus = [64 * w + b for w in range(4) for b in range(64) if mask[w] >> b & 1]
    snap = build_profile("dgx-a100", "n1")
    numa = snap.gpus[0].numa_node
    expected = next(n.cpu_list for n in snap.numa_nodes if n.id == numa)
    assert max(expected) < 256 and tuple(cpus) == expected


def test_mig_devices_gpu_instances_and_profiles(fake: FakeNvml) -> None:
    parent = fake.nvmlDeviceGetHandleByIndex(3)
    assert fake.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(parent, 5)
    instance = fake.nvmlDeviceGetGpuInstanceById(parent, fake.nvmlDeviceGetGpuInstanceId(mig))
    info = fake.nvmlGpuInstanceGetInfo(instance)
    assert isinstance(info, pynvml.c_nvmlGpuInstanceInfo_t)
    assert (info.profileId, info.placement.start, info.placement.size) == (5, 0, 4)  # 4g.40gb
    profile = fake.nvmlDeviceGetGpuInstanceProfileInfo(
        parent, pynvml.NVML_GPU_INSTANCE_PROFILE_4_SLICE
    )
    assert isinstance(profile, pynvml.c_nvmlGpuInstanceProfileInfo_v2_t)
    assert (profile.id, profile.name) == (5, "MIG 4g.40gb")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetGpuInstanceProfileInfo(parent, pynvml.NVML_GPU_INSTANCE_PROFILE_6_SLICE)


def test_fabric_info_fills_the_callers_structure() -> None:
    snap = build_profile("gb200-tray", "t1")
    nvml = FakeNvml.from_snapshot(snap)
    nvml.nvmlInit()
    info = pynvml.c_nvmlGpuFabricInfo_v3_t()
    assert (
        nvml.nvmlDeviceGetGpuFabricInfoV(nvml.nvmlDeviceGetHandleByIndex(0), info)
        == pynvml.NVML_SUCCESS
    )
    assert info.state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    assert snap.fabric is not None and info.cliqueId == snap.fabric.clique_id
    assert nvml.nvmlDeviceGetC2cModeInfoV(nvml.nvmlDeviceGetHandleByIndex(0)).isC2cEnabled == 1


def test_faults_raise_the_real_error_classes(fake: FakeNvml) -> None:
    fake.fail("nvmlDeviceGetUUID", 2, pynvml.NVMLError_NoPermission)
    handle = fake.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_NoPermission) as caught:
        fake.nvmlDeviceGetUUID(handle)
    assert isinstance(caught.value, pynvml.NVMLError)
    assert caught.value.value == pynvml.NVML_ERROR_NO_PERMISSION
    fake.lose_gpu(2)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        fake.nvmlDeviceGetName(handle)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetNvLinkState(fake.nvmlDeviceGetHandleByIndex(0), 12)  # A100: 12 links


def test_pcie_only_gpus_have_no_nvlink() -> None:
    nvml = FakeNvml.from_snapshot(build_profile("pcie-8x-l40s", "n1"))
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetNvLinkState(nvml.nvmlDeviceGetHandleByIndex(0), 0)
