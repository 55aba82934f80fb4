"""The agent's settings: flags over environment (``TOPOPLACE_AGENT_*``) over a TOML file.

Every setting has one name used in all three places: ``--node-name``,
``TOPOPLACE_AGENT_NODE_NAME`` and ``node_name = "..."`` in the file named by
``--config`` (or ``TOPOPLACE_AGENT_CONFIG``). Labels are ``--label k=v``
(repeatable), ``TOPOPLACE_AGENT_LABELS="k=v,k2=v2"`` or a ``[labels]``
table; a source's labels replace, not extend, a lower one's.
"""

from __future__ import annotations

import logging
import os
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from placement.snapshot import NodeSnapshot

log = logging.getLogger("topoplace.agent")
ENV_PREFIX = "TOPOPLACE_AGENT_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"


class ConfigError(ValueError):
    """Settings that cannot be used; the message names the setting and where it came from."""


class AgentConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    server: str | None = Field(default=None, description="the topoplace service URL")
    token_file: Path | None = Field(default=None, description="a file holding the API token")
    key_file: Path | None = Field(default=None, description="the node's Ed25519 private key")
    ca_bundle: Path | None = Field(
        default=None,
        description="CA certificates an https server's certificate must chain to"
        " (default: the system's)",
    )
    source: str = Field(default="nvml", description="nvml, smi:FILE, sim:PROFILE, fake:PROFILE")
    node_name: str | None = Field(default=None, description="default: the host name")
    region: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    gpu_model: str = Field(default="unknown", description="GPU model for smi:FILE sources")
    gpu_memory_mib: int = Field(
        default=0, ge=0, description="GPU memory (MiB) for smi:FILE sources; 0: unknown"
    )
    interval_s: float = Field(default=15.0, gt=0, description="seconds between rounds")
    telemetry_interval_s: float = Field(
        default=30.0,
        gt=0,
        description="NVLink counters go with a heartbeat at most once per this many seconds",
    )
    timeout_s: float = Field(default=10.0, gt=0, description="HTTP timeout")
    backoff_initial_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=60.0, gt=0)

    def resolved_node_name(self) -> str:
        return self.node_name or socket.gethostname().split(".")[0].lower()

    def token(self) -> str | None:
        if self.token_file is None:
            return None
        try:
            with self.token_file.open(encoding="utf-8") as handle:
                return handle.readline().strip() or None
        except OSError as exc:
            message = f"token_file: cannot read {self.token_file}: {exc.strerror}"
            raise ConfigError(message) from None


class TokenSink(Protocol):
    def set_token(self, token: str | None) -> None: ...


class TokenFile:
    """The token file read again when the service refuses the token (401): a token is
    rotated by deploying the new one to the file and then revoking the old one, and the
    agent must not keep sending the revoked one until it is restarted."""

    def __init__(self, config: AgentConfig, client: TokenSink) -> None:
        self.config = config
        self.client = client
        self.current = config.token()

    def reload(self) -> bool:
        """Read the file again; whether the token changed (the client then sends the new
        one). A file unreadable right now (mid-rotation) keeps the token in use."""
        try:
            token = self.config.token()
        except ConfigError as exc:
            log.warning("%s; keeping the token in use", exc)
            return False
        if token == self.current:
            return False
        self.client.set_token(token)
        self.current = token
        return True


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` (or a list of ``k=v``) as a dict; ConfigError on an item without '='."""
    labels: dict[str, str] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"label {item!r} is not KEY=VALUE")
        labels[key.strip()] = value.strip()
    return labels


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in AgentConfig.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is None or raw == "":
            continue
        values[name] = parse_labels(raw) if name == "labels" else raw
    return values


def _from_file(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read the config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return data


def load_config(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> AgentConfig:
    """Merge the three sources (flags win) and validate; ``None`` flags are not given."""
    env = os.environ if env is None else env
    path = config_file or (Path(env[CONFIG_ENV]) if env.get(CONFIG_ENV) else None)
    layers = [
        (f"config file {path}", _from_file(path) if path is not None else {}),
        ("environment", _from_env(env)),
        ("command line", {k: v for k, v in flags.items() if v is not None}),
    ]
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for where, values in layers:
        for key, value in values.items():
            merged[key] = value
            origin[key] = where
    try:
        config = AgentConfig.model_validate(merged)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else "settings"
        where = origin.get(key, "settings")
        raise ConfigError(f"{key} ({where}): {first['msg']}") from None
    _check_identity(config, origin)
    return config


def _check_identity(config: AgentConfig, origin: Mapping[str, str]) -> None:
    """Name, region and labels must make a valid snapshot; say which one does not."""
    name = config.resolved_node_name()
    try:
        NodeSnapshot(name=name, region=config.region, labels=config.labels)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = {"name": "node_name"}.get(str(first["loc"][0]), str(first["loc"][0]))
        where = origin.get(key, "the host name" if key == "node_name" else "settings")
        raise ConfigError(f"{key} ({where}): {first['msg']}") from None
