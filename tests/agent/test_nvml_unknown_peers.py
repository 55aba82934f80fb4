"""NVLinks whose remote PCI address is none of the node's GPUs or switches (a GPU hidden
from the agent's container, a driver's odd answer): left out with a warning, never a
failed round, an invented GPU or an invented switch between GPUs."""

from __future__ import annotations

import pynvml
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


def _untyped(fake: FakeNvml) -> None:
    """A driver that cannot say any link's remote type: the address decides."""
    for index in range(len(fake.gpus)):
        fake.fail("nvmlDeviceGetNvLinkRemoteDeviceType", index, pynvml.NVMLError_NotSupported)


def test_a_gpu_link_to_an_address_no_gpu_has_is_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, source, snap = _source("dgx1-v100")
    assert snap.links[0][3] == "NV2"
    fake.gpus[0].links[2].remote_bus_id = "00000000:EE:00.0"  # was one of GPU 3's two
    got = source.read()
    assert got.links[0][3] == "NV1" and len(got.gpus) == 8
    assert got.gpus[0].health == Health.HEALTHY
    assert "00000000:EE:00.0" in got.gpus[0].health_reason
    assert "00000000:EE:00.0" in caplog.text  # was: dropped without a word


def test_unknown_addresses_each_reached_by_one_gpu_are_not_taken_for_a_switch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GPUs 0 and 5 share no NVLink; each has one to a device the node does not list.
    fake, source, snap = _source("dgx1-v100")
    assert snap.links[0][5] == "SYS"
    _untyped(fake)
    fake.gpus[0].links[0].remote_bus_id = "00000000:EE:00.0"
    fake.gpus[5].links[0].remote_bus_id = "00000000:EF:00.0"
    got = source.read()
    assert got.links[0][5] == "SYS"  # was NVS1: a switch joining them, invented
    assert not any(label.startswith("NVS") for row in got.links for label in row)
    assert "00000000:EE:00.0" in got.gpus[0].health_reason
    assert "00000000:EF:00.0" in got.gpus[5].health_reason
    assert "00000000:EE:00.0" in caplog.text and "00000000:EF:00.0" in caplog.text


def test_switches_are_still_found_by_address_when_the_remote_type_is_unknown() -> None:
    fake, source, snap = _source("hgx-h100")
    _untyped(fake)
    got = source.read()
    assert got.links == snap.links
    assert all(g.health_reason == "" for g in got.gpus)


@pytest.mark.parametrize("address", [":EE:00.0", "GARBAGE", "0000:zz:00.0"])
def test_a_malformed_remote_address_is_a_link_left_out_not_a_failed_round(address: str) -> None:
    fake, source, _ = _source("dgx1-v100")
    fake.gpus[0].links[2].remote_bus_id = address
    got = source.read()  # was: ValueError out of discovery, no snapshot and no heartbeat
    assert got.links[0][3] == "NV1"
    assert got.gpus[0].health == Health.HEALTHY and address.upper() in got.gpus[0].health_reason


def test_a_gpu_naming_itself_with_a_malformed_address_does_not_fail_the_round() -> None:
    fake, source, _ = _source("dgx1-v100")
    fake.gpus[2].bus_id = ":18:00.0"
    got = source.read()
    assert len(got.gpus) == 8
    assert all(g.health == Health.HEALTHY for g in got.gpus if g.index != 2)
