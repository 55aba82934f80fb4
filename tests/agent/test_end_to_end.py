"""Agents in simulated mode against the real service on Postgres, over real HTTP.

Nodes appear when their agents start, turn stale when the agents stop (the
service's heartbeat TTL is one second here), and are ready again when the
agents restart with the same keys. One agent runs NVML discovery on the NVML
fake, so a GPU can fall off the bus mid-run. What the service stored
verifies with the signing recipe of docs/agent.md.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.nvml_fake import FakeNvml, fake_host
from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, NvmlSource, SimSource, Source
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.agent.test_signing import documented_verify
from tests.live_server import live_server
from topoplace.cli import main
from topoplace_client.api import ApiError, TopoplaceClient

NODES = {"e2e-h100": "hgx-h100", "e2e-dgx1": "dgx1-v100", "e2e-gb200": "gb200-tray"}
FAKE_NVML_NODE = "e2e-h100"
TTL_S = 1.0


@pytest.fixture
def server(postgres_url: str) -> Iterator[str]:
    settings = Settings(database_url=postgres_url, heartbeat_ttl_s=TTL_S)
    with live_server(create_app(settings)) as url:
        yield url


class Agents:
    """One agent thread per node, each with its own client; stopped together."""

    def __init__(self, server: str, keys: dict[str, NodeKey]) -> None:
        self.server = server
        self.keys = keys
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.clients: list[TopoplaceClient] = []
        self.nvml = FakeNvml.from_snapshot(build_profile(NODES[FAKE_NVML_NODE], FAKE_NVML_NODE))

    def _source(self, name: str, profile: str) -> Source:
        identity = Identity(name, labels={"e2e": "yes"})
        if name != FAKE_NVML_NODE:
            return SimSource(profile, identity)
        self.nvml = FakeNvml.from_snapshot(build_profile(profile, name))
        self.nvml.nvmlInit()
        return NvmlSource(self.nvml, fake_host(build_profile(profile, name)), identity)

    def start(self) -> None:
        self.stop = threading.Event()
        for name, profile in NODES.items():
            client = TopoplaceClient(self.server, timeout=5.0)
            agent = Agent(
                self._source(name, profile),
                client,
                self.keys[name],
                name,
                interval_s=0.2,
                backoff=Backoff(0.1, 0.5, random.Random(1)),
            )
            thread = threading.Thread(target=agent.run, args=(self.stop,), daemon=True)
            thread.start()
            self.threads.append(thread)
            self.clients.append(client)

    def halt(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)
            assert not thread.is_alive()
        for client in self.clients:
            client.close()
        self.threads, self.clients = [], []


def _wait_for(what: str, check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    pytest.fail(f"not within {timeout_s:g} s: {what}")


def _states(client: TopoplaceClient) -> dict[str, str]:
    return {node["name"]: node["state"] for node in client.nodes()["nodes"]}


def test_nodes_appear_go_stale_and_recover(server: str, tmp_path: Path) -> None:
    keys = {name: NodeKey.generate() for name in NODES}
    agents = Agents(server, keys)
    with TopoplaceClient(server) as client:
        agents.start()
        try:
            _wait_for("every node ready", lambda: _states(client) == dict.fromkeys(NODES, "ready"))
            # Heartbeats keep them ready well past the TTL.
            time.sleep(TTL_S * 1.5)
            assert _states(client) == dict.fromkeys(NODES, "ready")
            agents.nvml.lose_gpu(5)
            _wait_for(
                "the lost GPU reported unhealthy",
                lambda: client.node(FAKE_NVML_NODE)["gpus"][5]["health"] == "unhealthy",
            )
            node = client.node(FAKE_NVML_NODE)
            assert node["state"] == "ready" and node["free_gpus"] == [0, 1, 2, 3, 4, 6, 7]
        finally:
            agents.halt()

        for name in NODES:
            stored = client.node_key(name)["public_key"]
            assert stored == keys[name].public_key
            latest = client.snapshots(name)[0]
            documented_verify(stored, latest["snapshot"], latest["signature"])
        first_seq = {name: client.node(name)["seq"] for name in NODES}
        gb200 = client.node("e2e-gb200")
        assert gb200["gpu_count"] == 4 and gb200["fabric_domain"] is not None

        _wait_for("every node stale", lambda: _states(client) == dict.fromkeys(NODES, "stale"))
        # Placement re-reads staleness at most once a second: wait until it has.
        _wait_for(
            "no node eligible",
            lambda: not any(v["fits"] for v in client.score({"gpus": 1})["nodes"]),
        )
        with pytest.raises(ApiError) as refused:
            client.place({"gpus": 1})
        assert refused.value.status == 409 and refused.value.code == "unschedulable"

        agents.start()  # restarted, same keys
        try:
            _wait_for(
                "every node ready again", lambda: _states(client) == dict.fromkeys(NODES, "ready")
            )
            for name in NODES:
                assert client.node(name)["seq"] > first_seq[name]
            allocation = client.place({"gpus": 8, "locality": "nvlink", "gpu_models": ["H100"]})
            assert allocation["tasks"][0]["node"] == "e2e-h100"
        finally:
            agents.halt()

        # The command-line agent sends once with its key file; a different key is refused.
        key_file = tmp_path / "node.key"
        keys["e2e-h100"].save(key_file)
        base = ["agent", "--server", server, "--source", "sim:hgx-h100", "--node-name", "e2e-h100"]
        assert main([*base, "--key-file", str(key_file), "--once"]) == 0
        other = tmp_path / "other.key"
        NodeKey.generate().save(other)
        assert (
            main([*base, "--key-file", str(other), "--once"]) == 0
        )  # sent; the key is logged as refused
        assert client.node_key("e2e-h100")["public_key"] == keys["e2e-h100"].public_key
