"""A redirect is not a delivery: a 3xx answer (a proxy sending http to https, a moved
service) to a snapshot, heartbeat or key is an error naming the Location, and the
agent tries again; nothing is taken as acknowledged."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, SimSource
from tests.agent.scripted_front import ScriptedFront
from tests.topoplace.test_client_cmd import PROXY_VARIABLES
from topoplace.cli import main
from topoplace_client.api import ApiError, TopoplaceClient

MOVED = "https://topoplace.example/v1/nodes/n1/snapshot"
SNAPSHOT = ("PUT", "/v1/nodes/n1/snapshot")
HEARTBEAT = ("POST", "/v1/nodes/n1/heartbeat")


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in ("TOPOPLACE_AGENT_SERVER", "TOPOPLACE_AGENT_KEY_FILE", "TOPOPLACE_AGENT_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def _agent(client: TopoplaceClient) -> Agent:
    return Agent(
        SimSource("hgx-h100", Identity("n1")),
        client,
        NodeKey.generate(),
        "n1",
        interval_s=5.0,
        backoff=Backoff(1.0, 8.0, random.Random(7)),
    )


@pytest.mark.parametrize("status", [301, 302, 307, 308])
def test_a_redirected_snapshot_is_a_failure_and_is_sent_again(
    front: tuple[str, ScriptedFront], status: int, caplog: pytest.LogCaptureFixture
) -> None:
    url, scripted = front
    with TopoplaceClient(url, timeout=5) as client:
        agent = _agent(client)
        agent._register_key()
        # A gateway's redirect with a JSON body: was taken as the service's answer.
        scripted.answer(status, {"Location": MOVED}, {"moved": MOVED})
        assert 0 < agent.step() <= 1.0  # the backoff, not the interval
        assert agent.acked is None
        assert MOVED in caplog.text and str(status) in caplog.text
        assert agent.step() == 5.0
        assert scripted.seen.count(SNAPSHOT) == 2  # sent again, and the service has it
        assert client.node("n1")["name"] == "n1"


def test_a_redirected_heartbeat_is_a_failure(
    front: tuple[str, ScriptedFront], caplog: pytest.LogCaptureFixture
) -> None:
    url, scripted = front
    with TopoplaceClient(url, timeout=5) as client:
        agent = _agent(client)
        assert agent.step() == 5.0
        scripted.answer(301, {"Location": "https://topoplace.example/v1/nodes/n1/heartbeat"})
        assert 0 < agent.step() <= 1.0  # was 5.0: a heartbeat that never arrived, taken
        assert "https://topoplace.example/v1/nodes/n1/heartbeat" in caplog.text
        assert scripted.seen.count(HEARTBEAT) == 1


def test_the_client_raises_for_a_redirect(front: tuple[str, ScriptedFront]) -> None:
    url, scripted = front
    with TopoplaceClient(url, timeout=5) as client:
        scripted.answer(308, {"Location": MOVED}, {"node": "n1", "seq": 1, "changed": True})
        with pytest.raises(ApiError) as redirected:
            client.put_snapshot("n1", {"name": "n1"})
    assert redirected.value.status == 308 and redirected.value.code == "redirected"
    assert redirected.value.detail == {"location": MOVED}
    assert MOVED in redirected.value.message


def test_once_exits_1_naming_the_location(
    front: tuple[str, ScriptedFront], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, scripted = front
    key = tmp_path / "node.key"
    NodeKey.generate().save(key)
    args = ["agent", "--server", url, "--key-file", str(key), "--source", "sim:hgx-h100"]
    scripted.answer(200, None, {"node": "n1", "public_key": "k"})  # the key, then the move
    scripted.answer(301, {"Location": MOVED}, {"node": "n1", "seq": 1})
    assert main([*args, "--node-name", "n1", "--once"]) == 1
    captured = capsys.readouterr()
    assert MOVED in captured.err and "accepted" not in captured.out
