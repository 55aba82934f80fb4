"""`topoplace` itself: the commands other packages add through entry points."""

from __future__ import annotations

from importlib.metadata import distribution

import pytest

from topoplace import cli


def test_the_agent_command_is_declared_in_the_packaging() -> None:
    # Declared in pyproject.toml, read from the installed metadata: an editable
    # install made before the entry point existed must be reinstalled (`make install`).
    declared = {
        ep.name: ep.value
        for ep in distribution(cli.DISTRIBUTION).entry_points
        if ep.group == cli.COMMANDS_GROUP
    }
    assert declared == {
        "agent": "agent.cli:add_parser",
        "device-plugin": "agent.deviceplugin.cli:add_parser",
    }


def test_topoplace_agent_runs_the_agent(capsys: pytest.CaptureFixture[str]) -> None:
    # --once without a server prints the snapshot: the command as users run it.
    code = cli.main(["agent", "--once", "--source", "fake:hgx-h100", "--node-name", "n1"])
    assert code == 0
    assert '"name": "n1"' in capsys.readouterr().out


def test_help_lists_the_agent_among_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "run the node agent" in capsys.readouterr().out
