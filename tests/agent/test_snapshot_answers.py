"""A success that is no acknowledgement: a 200 to a snapshot without the node and seq the
service answers a stored snapshot with (a proxy's page, another service) is an error, in
one line for `--once` (exit 1), and the daemon sends the snapshot again."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from agent.runner import Agent, Backoff
from agent.signing import NodeKey
from agent.sources import Identity, SimSource
from tests.agent.scripted_front import ScriptedFront
from tests.topoplace.test_client_cmd import PROXY_VARIABLES
from topoplace.cli import main
from topoplace_client.api import TopoplaceClient

SNAPSHOT = ("PUT", "/v1/nodes/n1/snapshot")
NOT_ACKNOWLEDGEMENTS = [
    pytest.param({"ok": True}, id="another-shape"),
    pytest.param({}, id="empty"),
    pytest.param({"node": "n1"}, id="no-seq"),
    pytest.param({"seq": 7}, id="no-node"),
    pytest.param({"node": "n1", "seq": "7"}, id="seq-a-string"),
    pytest.param({"node": "n1", "seq": True}, id="seq-a-bool"),
]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name in ("TOPOPLACE_AGENT_SERVER", "TOPOPLACE_AGENT_KEY_FILE", "TOPOPLACE_AGENT_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("answer", NOT_ACKNOWLEDGEMENTS)
def test_once_exits_1_in_one_line(
    front: tuple[str, ScriptedFront],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    answer: dict[str, Any],
) -> None:
    url, scripted = front
    key = tmp_path / "node.key"
    NodeKey.generate().save(key)
    args = ["agent", "--server", url, "--key-file", str(key), "--source", "sim:hgx-h100"]
    scripted.answer(200, None, {"node": "n1", "public_key": "k"})  # the key, then the snapshot
    scripted.answer(200, None, answer)
    assert main([*args, "--node-name", "n1", "--once"]) == 1  # was a KeyError's traceback
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    assert line.startswith("topoplace agent: invalid_response: PUT ")
    assert "snapshot answered 200 without the node and seq" in line
    assert "accepted" not in captured.out


def test_the_daemon_does_not_take_it_for_delivered(front: tuple[str, ScriptedFront]) -> None:
    url, scripted = front
    with TopoplaceClient(url, timeout=5) as client:
        agent = Agent(
            SimSource("hgx-h100", Identity("n1")),
            client,
            NodeKey.generate(),
            "n1",
            interval_s=5.0,
            backoff=Backoff(1.0, 8.0, random.Random(7)),
        )
        agent._register_key()
        scripted.answer(200, None, {"ok": True})
        assert 0 < agent.step() <= 1.0  # the backoff, not the interval
        assert agent.acked is None
        assert agent.step() == 5.0  # sent again: the service has it now
        assert scripted.seen.count(SNAPSHOT) == 2
        assert client.node("n1")["name"] == "n1"
