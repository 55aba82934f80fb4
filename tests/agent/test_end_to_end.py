"""Agents in simulated mode against the real service on Postgres, over real HTTP.

Nodes appear when their agents start, turn stale when the agents stop and
the heartbeat TTL passes, and are ready again when the agents restart with
the same keys. The service runs on a fake clock the test moves on, so the TTL
passes when the test says, not after a wall-clock wait a loaded machine can
outrun; the agents heartbeat in real time. One agent runs NVML discovery on the NVML
fake, so a GPU can fall off the bus mid-run. What the service stored
verifies with the signing recipe of docs/agent.md.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from agent.config import AgentConfig, TokenFile
from agent.nvml_fake import FakeNvml, fake_host
from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, NvmlSource, SimSource, Source
from placement.profiles import build_profile
from service.app import create_app
from service.settings import Settings
from tests.agent.test_signing import documented_verify
from tests.live_server import live_server
from tests.service.conftest import FakeClock
from tests.waiting import wait_until
from topoplace.cli import main
from topoplace_client.api import ApiError, TopoplaceClient

NODES = {"e2e-h100": "hgx-h100", "e2e-dgx1": "dgx1-v100", "e2e-gb200": "gb200-tray"}
FAKE_NVML_NODE = "e2e-h100"
TTL_S = 1.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server(postgres_url: str, clock: FakeClock) -> Iterator[str]:
    settings = Settings(database_url=postgres_url, heartbeat_ttl_s=TTL_S)
    with live_server(create_app(settings, clock=clock)) as url:
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


def _states(client: TopoplaceClient) -> dict[str, str]:
    return {node["name"]: node["state"] for node in client.nodes()["nodes"]}


def _heard_since(client: TopoplaceClient, since: datetime) -> bool:
    """Every node's last heartbeat is at or after ``since`` on the service's clock."""
    return all(datetime.fromisoformat(client.node(n)["heartbeat_at"]) >= since for n in NODES)


def test_nodes_appear_go_stale_and_recover(server: str, clock: FakeClock, tmp_path: Path) -> None:
    keys = {name: NodeKey.generate() for name in NODES}
    agents = Agents(server, keys)
    with TopoplaceClient(server) as client:
        agents.start()
        try:
            wait_until(lambda: _states(client) == dict.fromkeys(NODES, "ready"), "every node ready")
            # Heartbeats keep them ready well past the TTL: half a TTL at a time,
            # the service's clock moves on and every agent's next heartbeat is awaited.
            for _ in range(3):
                clock.advance(TTL_S / 2)
                now = clock.now
                wait_until(lambda at=now: _heard_since(client, at), "a heartbeat from every agent")
                assert _states(client) == dict.fromkeys(NODES, "ready")
            agents.nvml.lose_gpu(5)
            wait_until(
                lambda: client.node(FAKE_NVML_NODE)["gpus"][5]["health"] == "unhealthy",
                "the lost GPU reported unhealthy",
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

        clock.advance(TTL_S * 1.5)  # the agents are stopped: no heartbeat within the TTL
        assert _states(client) == dict.fromkeys(NODES, "stale")
        assert not any(v["fits"] for v in client.score({"gpus": 1})["nodes"])
        with pytest.raises(ApiError) as refused:
            client.place({"gpus": 1})
        assert refused.value.status == 409 and refused.value.code == "unschedulable"

        agents.start()  # restarted, same keys
        try:
            wait_until(
                lambda: _states(client) == dict.fromkeys(NODES, "ready"), "every node ready again"
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
        # Its key registration is refused (another key holds the name): exit 1, nothing sent.
        assert main([*base, "--key-file", str(other), "--once"]) == 1
        assert client.node_key("e2e-h100")["public_key"] == keys["e2e-h100"].public_key


def test_an_agent_registers_its_key_again_after_the_service_forgot_the_node(
    server: str, tmp_path: Path
) -> None:
    """The service's node and key are gone (as after a database reset): the looping agent
    registers its key again before it reports, and a restart's snapshot is no change."""
    key = NodeKey.generate()
    name = "e2e-reset"
    with TopoplaceClient(server, timeout=5.0) as client:

        def agent() -> Agent:
            return Agent(
                SimSource("hgx-h100", Identity(name)),
                client,
                key,
                name,
                interval_s=5.0,
                backoff=Backoff(0.01, 0.05, random.Random(1)),
            )

        first = agent()
        assert first.step() == 5.0
        assert client.node_key(name)["public_key"] == key.public_key
        history = client.snapshots(name)
        # A restart sends the same node with a new seq: stored, but no new history row.
        assert agent().step() == 5.0
        assert client.snapshots(name) == history
        client.delete_node(name)
        client.delete_node_key(name)
        with pytest.raises(ApiError):
            client.node_key(name)
        assert first.step() == 5.0  # the heartbeat's 404, then key and snapshot again
        assert client.node_key(name)["public_key"] == key.public_key
        assert client.node(name)["state"] == "ready"


def test_two_nodes_each_with_a_gpu_lost_before_their_first_read_are_both_taken(
    server: str,
) -> None:
    """A GPU that falls off the bus before the agent ever read it has no UUID to report; the
    placeholder it gets is its node's own, so the service (which refuses a device UUID
    another node lists) takes both nodes with their seven healthy GPUs each."""
    with TopoplaceClient(server, timeout=5.0) as client:
        for name in ("e2e-lost-a", "e2e-lost-b"):
            snap = build_profile("pcie-8x-l40s", name)
            fake = FakeNvml.from_snapshot(snap)
            fake.nvmlInit()
            fake.lose_gpu(0)
            agent = Agent(
                NvmlSource(fake, fake_host(snap), Identity(name)),
                client,
                NodeKey.generate(),
                name,
                interval_s=5.0,
                backoff=Backoff(0.01, 0.05, random.Random(1)),
            )
            assert agent.step() == 5.0, name
            gpus = client.node(name)["gpus"]
            assert [g["health"] for g in gpus] == ["unhealthy"] + ["healthy"] * 7


def test_a_rotated_token_file_is_read_again_when_the_old_token_is_revoked(
    postgres_url: str, tmp_path: Path
) -> None:
    """Token rotation as docs/security.md has it: a new agent token is deployed to the
    agent's token file, then the old one is revoked. The running agent's next request is
    refused (401); it reads the file again and reports with the new token, unrestarted."""
    admin_token = "e2e-admin-token-0123456789abcdef"
    settings = Settings(database_url=postgres_url, api_tokens=admin_token, trust_on_first_use=True)
    name = "e2e-rotate"
    token_file = tmp_path / "agent.token"
    with (
        live_server(create_app(settings)) as url,
        TopoplaceClient(url, timeout=5.0, token=admin_token) as admin,
    ):
        old = admin.create_token("agent", nodes=[name])
        token_file.write_text(str(old["token"]) + "\n")
        config = AgentConfig(server=url, token_file=token_file)
        with TopoplaceClient(url, timeout=5.0, token=config.token()) as client:
            agent = Agent(
                SimSource("hgx-h100", Identity(name)),
                client,
                NodeKey.generate(),
                name,
                interval_s=5.0,
                backoff=Backoff(0.01, 0.05, random.Random(1)),
                reload_token=TokenFile(config, client).reload,
            )
            assert agent.step() == 5.0
            new = admin.create_token("agent", nodes=[name])
            token_file.write_text(str(new["token"]) + "\n")
            admin.revoke_token(str(old["id"]))
            assert agent.step() < 5.0  # refused: the file is read again
            assert agent.step() == 5.0  # the heartbeat, with the new token
            assert agent.step() == 5.0


def test_an_agent_restarted_behind_the_stored_seq_continues_after_it(server: str) -> None:
    """A new process whose clock stepped back an hour: its first snapshot's seq is older than
    the stored one, the service says so (409 with the stored seq), and the next is taken;
    --once does the same in one call."""
    key = NodeKey.generate()
    name = "e2e-clock-back"
    now = 1_900_000_000.0
    with TopoplaceClient(server, timeout=5.0) as client:

        def agent(at: float) -> Agent:
            return Agent(
                SimSource("hgx-h100", Identity(name)),
                client,
                key,
                name,
                interval_s=5.0,
                backoff=Backoff(0.01, 0.05, random.Random(1)),
                clock=lambda: at,
            )

        assert agent(now).step() == 5.0
        stored = client.node(name)["seq"]
        behind = agent(now - 3600)
        assert behind.step() == 0.0  # refused as a replay: continue after the stored seq
        assert behind.step() == 5.0
        assert client.node(name)["seq"] == stored + 1
        assert agent(now - 7200).send_once()["seq"] == stored + 2
