"""NVML failing part-way through a round: a GPU that cannot be read, or read right, is never
reported healthy, and never hides the node's other GPUs."""

from __future__ import annotations

from typing import Any

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
