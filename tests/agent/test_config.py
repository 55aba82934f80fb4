"""Agent settings: flags over TOPOPLACE_AGENT_* over the TOML file; errors name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import AgentConfig, ConfigError, TokenFile, load_config, parse_labels


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_flags_win_over_env_over_file(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        'server = "http://file:1"\nregion = "eu-west"\ninterval_s = 30\nnode_name = "from-file"\n'
        '[labels]\n"topoplace.io/rack" = "r1"\n',
    )
    env = {"TOPOPLACE_AGENT_SERVER": "http://env:2", "TOPOPLACE_AGENT_INTERVAL_S": "20"}
    config = load_config({"interval_s": 5.0, "region": None}, env, path)
    assert config.server == "http://env:2"
    assert config.interval_s == 5.0
    assert config.region == "eu-west"
    assert config.labels == {"topoplace.io/rack": "r1"}
    assert config.resolved_node_name() == "from-file"


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    path = _file(tmp_path, 'source = "sim:hgx-h100"\n')
    config = load_config(
        {}, {"TOPOPLACE_AGENT_CONFIG": str(path), "TOPOPLACE_AGENT_LABELS": "a=1,b=2"}
    )
    assert config.source == "sim:hgx-h100" and config.labels == {"a": "1", "b": "2"}


def test_errors_name_the_setting_and_its_origin(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"interval_s \(environment\)"):
        load_config({}, {"TOPOPLACE_AGENT_INTERVAL_S": "-1"})
    with pytest.raises(ConfigError, match=r"colour \(config file"):
        load_config({}, {}, _file(tmp_path, 'colour = "blue"\n'))
    with pytest.raises(ConfigError, match=r"node_name \(command line\)"):
        load_config({"node_name": "Not_A_Node"}, {})
    with pytest.raises(ConfigError, match=r"labels \(environment\)"):
        load_config({"node_name": "n1"}, {"TOPOPLACE_AGENT_LABELS": "bad key=1"})
    with pytest.raises(ConfigError, match=r"agent\.toml"):
        load_config({}, {}, _file(tmp_path, "server = \n"))


def test_token_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\nignored\n")
    assert load_config({"token_file": token, "node_name": "n1"}, {}).token() == "s3cret"
    with pytest.raises(ConfigError, match="token_file"):
        load_config({"token_file": tmp_path / "none", "node_name": "n1"}, {}).token()


def test_parse_labels() -> None:
    assert parse_labels(" a=1 , b = 2 ,") == {"a": "1", "b": "2"}
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_labels("a")


class _Client:
    def __init__(self) -> None:
        self.tokens: list[str | None] = []

    def set_token(self, token: str | None) -> None:
        self.tokens.append(token)


def test_the_token_file_read_again_hands_a_changed_token_to_the_client(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    client = _Client()
    tokens = TokenFile(AgentConfig(token_file=path), client)
    assert tokens.reload() is False and client.tokens == []
    path.write_text("second\n")
    assert tokens.reload() is True and client.tokens == ["second"]
    path.unlink()  # mid-rotation: the token in use is kept
    assert tokens.reload() is False and client.tokens == ["second"]
