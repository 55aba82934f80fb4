"""NVLink counters from the NVML fake, through an agent's heartbeats, to /metrics, over HTTP."""

from __future__ import annotations

import random
from collections.abc import Iterator

import httpx
import pytest

from agent.nvml_fake import FakeNvml, fake_host
from agent.nvml_telemetry import KIB
from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, NvmlSource
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.agent.test_runner import Clock
from tests.live_server import live_server
from tests.service.conftest import ADMIN_TOKEN, secured
from tests.service.metrics.scrape import parse, total
from topoplace_client.api import TopoplaceClient


def _metrics(server: str) -> str:
    return httpx.get(f"{server}/metrics", trust_env=False).text


NODE = "tele-dgx1"


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("db") / "topoplace.sqlite3"
    # Every reading kept: the service's clock is real here, the agent's is the test's.
    settings = Settings(database_url=f"sqlite:///{db}", nvlink_min_interval_s=0)
    with live_server(create_app(secured(settings), background=False)) as url:
        yield url


def test_counters_reach_metrics_through_heartbeats(server: str) -> None:
    profile = build_profile("dgx1-v100", NODE)
    fake = FakeNvml.from_snapshot(profile, traffic_kib=256)
    fake.nvmlInit()
    source = NvmlSource(fake, fake_host(profile), Identity(NODE))
    clock = Clock()
    with TopoplaceClient(server, token=ADMIN_TOKEN) as client:
        agent = Agent(
            source,
            client,
            NodeKey.generate(),
            NODE,
            interval_s=5.0,
            backoff=Backoff(1.0, 8.0, random.Random(7)),
            clock=clock,
            telemetry=source.nvlink,
            telemetry_interval_s=30.0,
        )
        assert agent.step() == 5.0  # key and snapshot: no counters with those
        assert f'node="{NODE}"' not in _metrics(server)
        assert agent.step() == 5.0  # the first heartbeat carries the counters
        fake.add_errors(2, 1, crc_flit_errors=4, recovery_errors=1)
        clock.now += 10
        assert agent.step() == 5.0  # a heartbeat without them: 10 s < 30 s
        first = parse(_metrics(server))[1]
        clock.now += 25
        assert agent.step() == 5.0  # 35 s on: the counters again, grown
        _, after = parse(_metrics(server))

    link = {"node": NODE, "gpu": "2", "link": "1"}
    assert total(first, "topoplace_nvlink_tx_bytes_total", **link) == 256 * KIB
    assert total(first, "topoplace_nvlink_crc_flit_errors_total", **link) == 0
    assert total(after, "topoplace_nvlink_tx_bytes_total", **link) == 512 * KIB
    assert total(after, "topoplace_nvlink_rx_bytes_total", **link) == 512 * KIB
    assert total(after, "topoplace_nvlink_crc_flit_errors_total", **link) == 4
    assert total(after, "topoplace_nvlink_recovery_errors_total", **link) == 1
    assert total(after, "topoplace_nvlink_replay_errors_total", **link) == 0
    # 8 GPUs x 6 links, every one reported
    assert len([k for k in after if k[0] == "topoplace_nvlink_tx_bytes_total"]) == 48
    assert total(after, "topoplace_nvlink_telemetry_reports_total", outcome="stored") == 2
