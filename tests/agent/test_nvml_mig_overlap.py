"""MIG instances whose placements overlap on one GPU (or run past its slices): that GPU's
MIG list is refused with an error naming the instances; the node's other GPUs and their
instances are still reported."""

from __future__ import annotations

import pytest

from agent.nvml_fake import FakeNvml, fake_host
from agent.sources import Identity, NvmlSource
from placement import Health, NodeSnapshot
from placement.profiles import build_profile


def _source() -> tuple[FakeNvml, NvmlSource, NodeSnapshot]:
    snap = build_profile("hgx-h100-mig", "n1")
    fake = FakeNvml.from_snapshot(snap)
    fake.nvmlInit()
    return fake, NvmlSource(fake, fake_host(snap), Identity("n1")), snap


def test_overlapping_instances_refuse_that_gpus_mig_list_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, source, snap = _source()
    first, second = fake.gpus[3].migs
    assert (first.start, first.size, second.start, second.size) == (0, 4, 4, 4)
    second.start = 2  # slices 2..5 over slices 0..3
    got = source.read()  # was: DiscoveryError, the whole node unreported
    assert not any(m.parent_gpu == 3 for m in got.mig_instances)
    others = [m.uuid for m in snap.mig_instances if m.parent_gpu != 3]
    assert [m.uuid for m in got.mig_instances] == others
    reason = got.gpus[3].health_reason
    assert first.uuid in reason and second.uuid in reason and "overlap" in reason
    assert got.gpus[3].mig_enabled and got.gpus[3].health == Health.HEALTHY
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert any(second.uuid in r.getMessage() for r in errors)


def test_an_instance_past_the_gpus_slices_refuses_its_mig_list() -> None:
    fake, source, _ = _source()
    fake.gpus[5].migs[-1].start = 62  # four slices from 62: past slice 63
    got = source.read()
    assert not any(m.parent_gpu == 5 for m in got.mig_instances)
    assert "past slice 63" in got.gpus[5].health_reason
    assert any(m.parent_gpu == 4 for m in got.mig_instances)


def test_instances_that_only_touch_are_kept() -> None:
    _, source, snap = _source()
    assert source.read().mig_instances == snap.mig_instances
