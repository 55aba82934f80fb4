"""Device files by minor number: NVML's GPU index is not the N of /dev/nvidiaN.

The driver numbers device files in probe order, NVML orders GPUs by PCI bus
id; on a board where the two differ, a file named by index is another GPU.
From the NVML fake to the snapshot, the stored snapshot, gres.conf's File=
and the device plugin's DeviceSpec.
"""

from __future__ import annotations

from typing import Any, cast

import pynvml  # type: ignore[import-untyped]

from agent.deviceplugin.container import ContainerOptions
from agent.deviceplugin.devices import advertised
from agent.deviceplugin.gen.deviceplugin.v1beta1 import api_pb2 as pb
from agent.deviceplugin.plugin import ResourcePlugin
from agent.deviceplugin.state import Claims, Devices, ReservationCache
from agent.nvml_fake import FakeNvml, fake_host
from agent.sources import Identity, NvmlSource
from placement.profiles import build_profile
from placement.snapshot import Health, NodeSnapshot
from slurm_formats.conf import gres_conf_lines

# Probe order: the second PCIe switch's GPUs came up first.
MINORS = [4, 5, 6, 7, 0, 1, 2, 3]


def _source() -> tuple[FakeNvml, NvmlSource]:
    snap = build_profile("hgx-h100", "n1")
    fake = FakeNvml.from_snapshot(snap)
    for gpu, minor in zip(fake.gpus, MINORS, strict=True):
        gpu.minor_number = minor
    fake.nvmlInit()
    return fake, NvmlSource(fake, fake_host(snap), Identity("n1"))


def _device_files(snap: NodeSnapshot, uuids: list[str]) -> list[str]:
    """The /dev/nvidiaN a kubelet Allocate of ``uuids`` is given, through the plugin."""
    devices = Devices()
    devices.update("nvidia.com/gpu", advertised(snap, "nvidia.com/gpu"))
    plugin = ResourcePlugin(
        "nvidia.com/gpu",
        devices,
        Claims(),
        ReservationCache(lambda: []),
        ContainerOptions(device_specs=True),
        lambda: None,
        lambda: False,
    )
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=uuids)]
    )
    answer = plugin.Allocate(request, cast(Any, None))
    specs = answer.container_responses[0].devices
    return [d.host_path for d in specs if d.host_path[len("/dev/nvidia") :].isdigit()]


def test_minor_numbers_reach_the_snapshot_gres_conf_and_the_device_specs() -> None:
    _, source = _source()
    snap = source.read()
    assert [g.minor_number for g in snap.gpus] == MINORS
    lines = gres_conf_lines(snap, "/dev")
    # Was: File=/dev/nvidia0, the device file of the GPU NVML calls 4.
    assert "Type=g0 File=/dev/nvidia4 " in lines[0]
    assert "Type=g5 File=/dev/nvidia1 " in lines[5]
    assert _device_files(snap, [snap.gpus[0].uuid, snap.gpus[5].uuid]) == [
        "/dev/nvidia1",
        "/dev/nvidia4",
    ]


def test_a_driver_that_cannot_say_falls_back_to_the_index() -> None:
    fake, source = _source()
    fake.fail("nvmlDeviceGetMinorNumber", 2, pynvml.NVMLError_NotSupported)
    fake.fail("nvmlDeviceGetMinorNumber", 3, pynvml.NVMLError_NoPermission)
    snap = source.read()
    assert [g.minor_number for g in snap.gpus[:4]] == [4, 5, None, None]
    assert snap.gpus[2].health_reason == ""
    assert "nvmlDeviceGetMinorNumber" in snap.gpus[3].health_reason
    assert all(g.health is Health.HEALTHY for g in snap.gpus)
    assert "Type=g2 File=/dev/nvidia2 " in gres_conf_lines(snap)[2]
    assert _device_files(snap, [snap.gpus[2].uuid]) == ["/dev/nvidia2"]
    # GPUs 6 and 7 have the minor numbers 2 and 3, the files GPUs 2 and 3 fall back to:
    # was /dev/nvidia2 for GPUs 2 and 6 both, and two jobs given one GPU.
    assert [g.minor_number for g in snap.gpus[4:]] == [0, 1, None, None]
    assert "the device file GPU 2 falls back to" in snap.gpus[6].health_reason
    assert sorted(g.device_minor for g in snap.gpus) == list(range(8))


def test_one_minor_number_for_two_gpus_is_said_for_neither() -> None:
    fake, source = _source()
    fake.gpus[6].minor_number = 5
    snap = source.read()  # the node is still reported
    # GPUs 1 and 6 fall back to /dev/nvidia1 and /dev/nvidia6, GPU 5's and GPU 2's
    # minor numbers: those are left out too, so no file is given to two GPUs.
    assert [g.minor_number for g in snap.gpus] == [4, None, None, 7, 0, None, None, 3]
    assert sorted(g.device_minor for g in snap.gpus) == list(range(8))
    assert "NVML gives the minor number 5 for GPUs 1, 6" in snap.gpus[1].health_reason
    assert snap.gpus[6].health is Health.HEALTHY


def test_a_lost_gpu_keeps_its_device_file() -> None:
    fake, source = _source()
    source.read()
    fake.lose_gpu(1)
    lost = source.read().gpus[1]
    assert lost.health is Health.UNHEALTHY and lost.minor_number == 5
