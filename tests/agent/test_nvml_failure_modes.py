"""NVML failing part-way through a round: a GPU that cannot be read, or read right, is never
reported healthy, and never hides the node's other GPUs."""

from __future__ import annotations

from typing import Any

import pytest

from agent.nvml_fake import FakeNvml, fake_host
from agent.sources import Identity, NvmlSource
from placement import Health, NodeSnapshot
from placement.profiles import build_profile


def _source(profile: str) -> tuple[FakeNvml, NvmlSource, NodeSnapshot]:
    snap = build_profile(profile, "n1")
    fake = FakeNvml.from_snapshot(snap)
    fake.nvmlInit()
    return fake, NvmlSource(fake, fake_host(snap), Identity("n1")), snap


def test_a_gpu_lost_while_the_pcie_relations_are_read_is_unhealthy() -> None:
    # The GPU falls off the bus after its own facts and links were read, at the first
    # question about how two GPUs are related through PCIe.
    fake, source, snap = _source("pcie-8x-l40s")
    ancestor = fake.nvmlDeviceGetTopologyCommonAncestor

    def falls_off(device1: Any, device2: Any) -> int:
        fake.lose_gpu(5)
        return ancestor(device1, device2)

    fake.nvmlDeviceGetTopologyCommonAncestor = falls_off  # type: ignore[method-assign]
    got = source.read()
    lost = got.gpus[5]
    # was: healthy, and each other GPU noted "PCIe relation to GPU 5 unknown: GPU is lost"
    assert lost.health is Health.UNHEALTHY and "GPU is lost" in lost.health_reason
    assert lost.uuid == snap.gpus[5].uuid
    assert all(got.links[5][j] == "SYS" for j in range(8) if j != 5)
    others = [g for g in got.gpus if g.index != 5]
    assert all(g.health is Health.HEALTHY and not g.health_reason for g in others)
    assert got.links[0][1] == snap.links[0][1]


@pytest.mark.parametrize("uuid", ["GPU-1 2", "GPU-1,GPU-2", "GPU-\u00e9", "cpu:0"])
def test_a_gpu_uuid_no_device_list_can_carry_is_unhealthy_not_a_failed_round(uuid: str) -> None:
    fake, source, _ = _source("dgx1-v100")
    first = source.read()
    fake.gpus[3].uuid = uuid
    got = source.read()  # was: DiscoveryError, no snapshot and no heartbeat for 8 GPUs
    assert got.gpus[3].health is Health.UNHEALTHY
    assert "nvmlDeviceGetUUID" in got.gpus[3].health_reason
    assert got.gpus[3].uuid == first.gpus[3].uuid  # as the last report had it
    assert all(g.health is Health.HEALTHY for g in got.gpus if g.index != 3)


@pytest.mark.parametrize("uuid", ["MIG-1 2", "MIG-1,MIG-2", "cpu:0"])
def test_a_mig_uuid_no_device_list_can_carry_leaves_that_device_out(uuid: str) -> None:
    fake, source, snap = _source("dgx-a100-mig")
    odd = fake.gpus[1].migs[0].uuid
    fake.gpus[1].migs[0].uuid = uuid
    got = source.read()  # was: DiscoveryError, the node and its other instances hidden
    assert "MIG device 0: nvmlDeviceGetUUID answered" in got.gpus[1].health_reason
    assert [m.uuid for m in got.mig_instances] == [
        m.uuid for m in snap.mig_instances if m.uuid != odd
    ]


def test_a_mig_uuid_answered_as_bytes_is_read_as_text() -> None:
    # Older nvidia-ml-py answers bytes; a GPU's UUID was decoded, a MIG device's was not.
    fake, source, snap = _source("dgx-a100-mig")
    said = fake.gpus[1].migs[0].uuid
    fake.gpus[1].migs[0].uuid = said.encode()  # type: ignore[assignment]
    got = source.read()
    uuids = {m.uuid for m in got.mig_instances}
    assert said in uuids and f"b'{said}'" not in uuids  # was: b'MIG-...' given to a job
    assert uuids == {m.uuid for m in snap.mig_instances}


def test_mig_uuids_another_device_also_has_leave_those_instances_out() -> None:
    fake, source, snap = _source("dgx-a100-mig")
    shared, gpu_said = fake.gpus[0].migs[0].uuid, fake.gpus[2].uuid
    fake.gpus[1].migs[0].uuid = shared  # two MIG devices, one UUID
    fake.gpus[1].migs[1].uuid = gpu_said  # a MIG device with a GPU's UUID
    # was: DiscoveryError 'duplicate UUID', no snapshot and no heartbeat for the node
    got = source.read()
    left_out = {shared, snap.mig_instances[7].uuid, snap.mig_instances[8].uuid}
    assert [m.uuid for m in got.mig_instances] == [
        m.uuid for m in snap.mig_instances if m.uuid not in left_out
    ]
    assert shared in got.gpus[0].health_reason and shared in got.gpus[1].health_reason
    assert gpu_said in got.gpus[1].health_reason
    assert all(g.health is Health.HEALTHY for g in got.gpus)
    assert got.gpus[2].uuid == gpu_said
