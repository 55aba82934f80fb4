"""Two GPUs NVML gives one UUID: the snapshot is refused with an error naming the UUID and
the GPUs, not sent (the service would take them for one device) and not a validation dump."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.nvml_discovery import DiscoveryError
from agent.nvml_fake import FakeNvml, fake_host
from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, NvmlSource
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from tests.topoplace.test_client_cmd import PROXY_VARIABLES
from topoplace_client.api import ApiError, TopoplaceClient


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'service.db'}")
    with live_server(create_app(settings)) as url:
        yield url


def _source() -> tuple[FakeNvml, NvmlSource]:
    snap = build_profile("hgx-h100", "n1")
    fake = FakeNvml.from_snapshot(snap)
    fake.nvmlInit()
    return fake, NvmlSource(fake, fake_host(snap), Identity("n1"))


def test_duplicate_gpu_uuids_refuse_the_snapshot_naming_the_uuid_and_the_gpus() -> None:
    fake, source = _source()
    twice = fake.gpus[1].uuid
    fake.gpus[3].uuid = twice
    with pytest.raises(DiscoveryError) as refused:
        source.read()
    message = str(refused.value)
    assert f"UUID {twice} for GPUs 1 and 3" in message
    # Was: "NVML reported an inconsistent node: 1 validation error for NodeSnapshot\n..."
    assert "\n" not in message and "validation error" not in message


def test_the_agent_sends_nothing_while_nvml_gives_duplicates(
    server: str, caplog: pytest.LogCaptureFixture
) -> None:
    fake, source = _source()
    twice = fake.gpus[0].uuid
    fake.gpus[5].uuid = fake.gpus[6].uuid = twice
    with TopoplaceClient(server, timeout=5) as client:
        agent = Agent(
            source,
            client,
            NodeKey.generate(),
            "n1",
            interval_s=5.0,
            backoff=Backoff(1.0, 8.0, random.Random(7)),
        )
        assert agent.step() <= 1.0  # the backoff: a failed round
        assert f"UUID {twice} for GPUs 0, 5 and 6" in caplog.text
        with pytest.raises(ApiError) as unknown:
            client.node("n1")
        assert unknown.value.status == 404
        fake.gpus[5].uuid, fake.gpus[6].uuid = "GPU-5-fixed", "GPU-6-fixed"
        assert agent.step() == 5.0
        assert client.node("n1")["name"] == "n1"
