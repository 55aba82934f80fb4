"""NVLink counters through NVML field values, on the NVML fake, and how often they go out."""

from __future__ import annotations

import itertools
import random
from typing import Any

import pynvml
import pytest

from agent.nvml_fake import FakeNvml, fake_host
from agent.nvml_telemetry import KIB, link_fields, read_nvlink
from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, NvmlSource
from placement.profiles import build_profile
from tests.agent.test_runner import Clock, ScriptedService


def _fake(profile: str = "dgx1-v100", **kwargs: Any) -> FakeNvml:
    fake = FakeNvml.from_snapshot(build_profile(profile, "n1"), **kwargs)
    fake.nvmlInit()
    return fake


def _by_link(entries: list[dict[str, int]]) -> dict[tuple[int, int], dict[str, int]]:
    return {(e["gpu"], e["link"]): e for e in entries}


def test_every_active_link_is_read_and_its_counters_grow() -> None:
    fake = _fake(traffic_kib=4)
    first = _by_link(read_nvlink(fake))
    # A DGX-1: 8 V100s, 6 NVLinks each.
    assert len(first) == 8 * 6
    assert first[(0, 0)]["tx_bytes"] == 4 * KIB and first[(0, 0)]["rx_bytes"] == 4 * KIB
    fake.add_errors(3, 2, crc_flit_errors=5, replay_errors=1)
    second = _by_link(read_nvlink(fake))
    assert second[(0, 0)]["tx_bytes"] == 8 * KIB
    assert second[(3, 2)]["crc_flit_errors"] == 5 and second[(3, 2)]["replay_errors"] == 1
    assert second[(3, 2)]["crc_data_errors"] == 0 and second[(3, 1)]["crc_flit_errors"] == 0


def test_a_link_that_is_down_is_not_read() -> None:
    fake = _fake()
    fake.set_link_active(1, 4, False)
    read = _by_link(read_nvlink(fake))
    assert (1, 4) not in read and (1, 3) in read


def test_fields_the_gpu_does_not_offer_are_left_out() -> None:
    fake = _fake()
    fake.unsupported_fields |= {
        pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_L0,
    }
    read = _by_link(read_nvlink(fake))
    assert "rx_bytes" not in read[(0, 0)] and "tx_bytes" in read[(0, 0)]
    assert "recovery_errors" not in read[(0, 0)] and "recovery_errors" in read[(0, 1)]


def test_a_byte_counter_past_64_bits_is_left_out_not_sent() -> None:
    # NVML counts KiB; a counter past 2^54 KiB (a wrapped or "not available" all-ones
    # value) is more bytes than the heartbeat's 64-bit field takes, and one such value
    # would have the service refuse the whole heartbeat (422).
    fake = _fake()
    fake.gpus[2].links[1].tx_kib = 2**60
    read = _by_link(read_nvlink(fake))
    assert all(v <= 2**64 - 1 for entry in read.values() for v in entry.values())
    assert "tx_bytes" not in read[(2, 1)] and "rx_bytes" in read[(2, 1)]
    assert "tx_bytes" in read[(2, 0)]


def test_a_gpu_without_field_values_or_lost_contributes_nothing() -> None:
    fake = _fake()
    fake.fail("nvmlDeviceGetFieldValues", 2, pynvml.NVMLError_NotSupported)
    fake.lose_gpu(5)
    gpus = {e["gpu"] for e in read_nvlink(fake)}
    assert gpus == {0, 1, 3, 4, 6, 7}


def test_a_machine_without_nvlink_reports_no_links() -> None:
    assert read_nvlink(_fake("pcie-8x-l40s")) == []


def test_error_counters_are_asked_only_for_links_nvml_numbers() -> None:
    assert {name for name, _, _ in link_fields(11)} >= {"crc_flit_errors", "recovery_errors"}
    assert {name for name, _, _ in link_fields(12)} == {"tx_bytes", "rx_bytes"}
    assert all(scope == 17 for name, _, scope in link_fields(17) if name.endswith("bytes"))


class TelemetryService(ScriptedService):
    def heartbeat(self, name: str, nvlink: list[dict[str, int]] | None = None) -> None:
        self._maybe_fail()
        self.calls.append(("heartbeat", nvlink))


@pytest.mark.parametrize("interval_s", [30.0, 12.0])
def test_counters_ride_on_a_heartbeat_at_most_once_per_interval(interval_s: float) -> None:
    profile = build_profile("dgx1-v100", "n1")
    fake = _fake()
    source = NvmlSource(fake, fake_host(profile), Identity("n1"))
    service, clock = TelemetryService(), Clock()
    agent = Agent(
        source,
        service,
        NodeKey.generate(),
        "n1",
        interval_s=5.0,
        backoff=Backoff(1.0, 8.0, random.Random(7)),
        clock=clock,
        telemetry=source.nvlink,
        telemetry_interval_s=interval_s,
    )
    sent_at = []
    for _ in range(20):  # 100 s of rounds, one every 5 s
        agent.step()
        kind, body = service.calls[-1]
        if kind == "heartbeat" and body is not None:
            sent_at.append(clock.now)
            assert len(body) == 48
        clock.now += 5.0
    gaps = [b - a for a, b in itertools.pairwise(sent_at)]
    assert sent_at and all(gap >= interval_s for gap in gaps)
    assert len(sent_at) >= int(95 // (interval_s + 5.0))


def test_counters_are_not_held_back_for_as_long_as_the_clock_stepped_back() -> None:
    profile = build_profile("dgx1-v100", "n1")
    source = NvmlSource(_fake(), fake_host(profile), Identity("n1"))
    service, clock = TelemetryService(), Clock()
    agent = Agent(
        source,
        service,
        NodeKey.generate(),
        "n1",
        interval_s=5.0,
        backoff=Backoff(1.0, 8.0, random.Random(7)),
        clock=clock,
        telemetry=source.nvlink,
        telemetry_interval_s=30.0,
    )
    agent.step()  # key and snapshot
    agent.step()
    assert service.calls[-1][1] is not None  # counters with the first heartbeat
    clock.now -= 3600.0  # NTP steps the clock back an hour
    sent = []
    for _ in range(8):  # 40 s of rounds
        clock.now += 5.0
        agent.step()
        sent.append(service.calls[-1][1] is not None)
    assert any(sent), "no counters for as long as the clock went back"
