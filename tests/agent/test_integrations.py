"""The shipped agent files: the example settings load, the unit runs the agent with them."""

from __future__ import annotations

import configparser
from pathlib import Path

from agent.config import load_config

FILES = Path(__file__).resolve().parents[2] / "integrations" / "agent"


def test_example_settings_are_valid() -> None:
    config = load_config({"node_name": "gpu-node-1"}, {}, FILES / "agent.toml")
    assert config.source == "nvml" and config.interval_s == 15
    assert config.labels["topoplace.io/rack"] == "r12"
    assert config.key_file == Path("/etc/topoplace/node.key")


def test_systemd_unit_runs_the_agent_with_the_example_settings() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(FILES / "topoplace-agent.service")
    service = unit["Service"]
    assert service["ExecStart"].split()[1:] == ["agent", "--config", "/etc/topoplace/agent.toml"]
    # Bad settings (2) and no usable driver (4) are not fixed by restarting.
    assert service["RestartPreventExitStatus"].split() == ["2", "4"]
    # Environment wins over the file: the credential copies are used.
    assert service["Environment"].split() == [
        "TOPOPLACE_AGENT_KEY_FILE=%d/node.key",
        "TOPOPLACE_AGENT_TOKEN_FILE=%d/token",
    ]
