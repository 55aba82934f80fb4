"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The compose checks need PyYAML and are skipped without it. The simulated
agents' commands are also run against a real service (SQLite, in a thread),
since nothing here can start the compose stack itself.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from placement.profiles import profile_names

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
# Compose's `${VAR:-default}`: checked here with the default it falls back to.
INTERPOLATION = re.compile(r"\$\{(\w+):-([^}]*)\}")


def resolve(value: str) -> str:
    return INTERPOLATION.sub(lambda m: m.group(2), value)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: resolve(str(value)) for key, value in env.items()}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read docker-compose.yml")
    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    parsed: dict[str, Any] = compose["services"]
    assert "pgdata" in compose.get("volumes", {})
    return parsed


@pytest.fixture(scope="module")
def agents(services: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {name: svc for name, svc in services.items() if name.startswith("agent-")}
    assert found, "docker-compose.yml has no agent-* services"
    return found


def test_the_three_services_exist(services: dict[str, Any]) -> None:
    assert {"postgres", "topoplace"} <= set(services)
    assert sum(name.startswith("agent-") for name in services) >= 4


def test_postgres(services: dict[str, Any]) -> None:
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:16")
    env = environment(pg)
    assert env["POSTGRES_DB"] == "topoplace" and env["POSTGRES_PASSWORD"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert any(v.startswith("pgdata:") for v in pg["volumes"])


def test_service_uses_the_postgres_service(services: dict[str, Any]) -> None:
    svc = services["topoplace"]
    pg_env = environment(services["postgres"])
    url = sa.engine.make_url(environment(svc)["TOPOPLACE_DATABASE_URL"])
    assert url.drivername == "postgresql+psycopg"
    assert (url.host, url.port, url.database) == ("postgres", 5432, "topoplace")
    assert url.username == pg_env["POSTGRES_USER"]
    assert url.password == pg_env["POSTGRES_PASSWORD"]
    assert environment(svc)["TOPOPLACE_HOST"] == "0.0.0.0"


def test_service_waits_for_postgres_and_publishes_rest_and_grpc(services: dict[str, Any]) -> None:
    svc = services["topoplace"]
    assert svc["build"] == "."
    assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert {"8080:8080", "50051:50051"} <= {str(p) for p in svc["ports"]}
    assert environment(svc)["TOPOPLACE_GRPC_PORT"] == "50051"
    check = svc["healthcheck"]["test"]
    assert check[:3] == ["CMD", "python", "-c"]
    assert "/readyz" in check[3]
    compile(check[3], "healthcheck", "exec")


def test_agents_run_the_real_agent_on_known_profiles(agents: dict[str, dict[str, Any]]) -> None:
    names = set()
    for service in agents.values():
        env = environment(service)
        assert service["depends_on"]["topoplace"]["condition"] == "service_healthy"
        assert env["TOPOPLACE_AGENT_SERVER"] == "http://topoplace:8080"
        kind, _, profile = env["TOPOPLACE_AGENT_SOURCE"].partition(":")
        assert kind == "sim" and profile in profile_names()
        names.add(env["TOPOPLACE_AGENT_NODE_NAME"])
        command = service["command"]
        assert command[:2] == ["sh", "-c"] and "exec topoplace agent" in command[2]
        assert "$" not in command[2]  # Compose would substitute it
    assert len(names) == len(agents)  # one node name per agent


def test_dockerfile_runs_the_service_unprivileged() -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    instructions = [line.split(None, 1) for line in text.splitlines() if line and line[0] != "#"]
    by_name: dict[str, list[str]] = {}
    for parts in instructions:
        if len(parts) == 2 and parts[0].isupper():
            by_name.setdefault(parts[0], []).append(parts[1])
    assert by_name["FROM"] == ["python:3.11-slim"]
    assert json.loads(by_name["CMD"][-1]) == ["topoplace", "serve"]
    assert by_name["EXPOSE"] == ["8080 50051"]
    assert by_name["USER"][-1] not in ("root", "0")
    assert "TOPOPLACE_HOST=0.0.0.0" in text
    assert any("pip install ." in run for run in by_name["RUN"])


# --- the agents' script against a real service -----------------------------------------


KEY_MOUNT = "/var/lib/topoplace"


def _key_volume(service: dict[str, Any]) -> str:
    """The named volume an agent service keeps its node key on."""
    (volume,) = [v for v in service["volumes"] if v.partition(":")[2] == KEY_MOUNT]
    return str(volume).partition(":")[0]


def _script(service: dict[str, Any], key_dir: Path) -> str:
    """The agent service's shell command, its key volume's mount point replaced by key_dir."""
    _key_volume(service)  # the key is on a volume: a restart keeps it
    assert KEY_MOUNT in service["command"][2]
    key_dir.mkdir(parents=True, exist_ok=True)
    return str(service["command"][2]).replace(KEY_MOUNT, str(key_dir))


def test_each_agent_keeps_its_key_on_a_volume_of_its_own(
    services: dict[str, Any], agents: dict[str, dict[str, Any]]
) -> None:
    volumes = [_key_volume(service) for service in agents.values()]
    assert len(set(volumes)) == len(agents)  # one key per node, not one shared
    yaml = pytest.importorskip("yaml")
    declared = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["volumes"]
    assert set(volumes) <= set(declared)
    for service in agents.values():
        assert "--force" not in service["command"][2]  # a restart must not make a new key


def test_the_service_and_agents_use_the_generated_tokens(services: dict[str, Any]) -> None:
    assert environment(services["topoplace"])["TOPOPLACE_API_TOKEN_FILE"] == "/secrets/admin.token"
    assert "TOPOPLACE_INSECURE_DEV" not in environment(services["topoplace"])
    assert "secrets:/secrets:ro" in services["topoplace"]["volumes"]
    made = environment(services["secrets"])["TOPOPLACE_AGENT_NODES"].split()
    for name, service in services.items():
        if name.startswith("agent-"):
            env = environment(service)
            assert (
                env["TOPOPLACE_AGENT_TOKEN_FILE"]
                == f"/secrets/{env['TOPOPLACE_AGENT_NODE_NAME']}.token"
            )
            assert env["TOPOPLACE_AGENT_NODE_NAME"] in made
            assert "secrets:/secrets:ro" in service["volumes"]


def test_agents_register_their_own_first_key(services: dict[str, Any]) -> None:
    """Compose gives agents agent tokens, not admin ones: they can register their node's
    first key only because the service trusts on first use."""
    assert environment(services["topoplace"])["TOPOPLACE_TRUST_ON_FIRST_USE"] == "true"


@pytest.fixture
def secrets_dir(services: dict[str, Any], tmp_path: Path) -> Path:
    """The `secrets` service's own script, run here on a SQLite database (twice: the second
    run, a restart, keeps what the first made)."""
    service = services["secrets"]
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    env = {
        **os.environ,
        **environment(service),
        "TOPOPLACE_SECRETS_DIR": str(secrets),
        "TOPOPLACE_DATABASE_URL": f"sqlite:///{tmp_path / 'agents.sqlite3'}",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    script = service["command"][2].replace("$$", "$")  # as Compose hands it to the shell
    subprocess.run([service["command"][0], service["command"][1], script], env=env, check=True)
    made = {p.name: p.read_text() for p in secrets.iterdir()}
    subprocess.run([service["command"][0], service["command"][1], script], env=env, check=True)
    assert {p.name: p.read_text() for p in secrets.iterdir()} == made
    assert len(made["admin.token"].strip()) >= 32
    return secrets


@pytest.fixture
def live_service(
    services: dict[str, Any],
    tmp_path: Path,
    secrets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[str]:
    """The topoplace service with its compose environment (tokens, trust on first use),
    its database, token file and listening address replaced by local ones."""
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    for key, value in environment(services["topoplace"]).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TOPOPLACE_DATABASE_URL", f"sqlite:///{tmp_path / 'agents.sqlite3'}")
    monkeypatch.setenv(
        "TOPOPLACE_API_TOKEN_FILE",
        environment(services["topoplace"])["TOPOPLACE_API_TOKEN_FILE"].replace(
            "/secrets", str(secrets_dir)
        ),
    )
    monkeypatch.setenv("TOPOPLACE_GRPC_PORT", "off")  # REST is what the agents use
    monkeypatch.delenv("TOPOPLACE_INSECURE_DEV", raising=False)  # as compose: tokens only
    settings = Settings()
    assert settings.trust_on_first_use and not settings.insecure_dev
    app = create_app(settings, background=False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the service did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


def test_the_agent_services_report_to_a_live_service(
    agents: dict[str, dict[str, Any]], live_service: str, tmp_path: Path, secrets_dir: Path
) -> None:
    """Each agent service's own command and environment, run here against a real service."""
    bin_dir = str(Path(sys.executable).parent)
    admin = {"Authorization": f"Bearer {(secrets_dir / 'admin.token').read_text().strip()}"}
    procs = []
    try:
        for name, service in agents.items():
            env = {
                **os.environ,
                **environment(service),
                "TOPOPLACE_AGENT_SERVER": live_service,
                "TOPOPLACE_AGENT_TOKEN_FILE": environment(service)[
                    "TOPOPLACE_AGENT_TOKEN_FILE"
                ].replace("/secrets", str(secrets_dir)),
                "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}",
            }
            script = _script(service, tmp_path / name)
            procs.append(subprocess.Popen(["sh", "-c", script], env=env))
        wanted = {environment(s)["TOPOPLACE_AGENT_NODE_NAME"] for s in agents.values()}
        deadline = time.monotonic() + 60
        ready: set[str] = set()
        while ready != wanted:
            assert time.monotonic() < deadline, f"nodes never reported: {wanted - ready}"
            assert all(p.poll() is None for p in procs), "an agent exited"
            time.sleep(0.2)
            listing = httpx.get(f"{live_service}/v1/nodes", timeout=5, headers=admin).json()[
                "nodes"
            ]
            ready = {n["name"] for n in listing if n["state"] == "ready"}
        for name in wanted:
            node = httpx.get(f"{live_service}/v1/nodes/{name}", timeout=5, headers=admin).json()
            assert node["labels"]["topoplace.io/simulated"] == "true"
            key = httpx.get(f"{live_service}/v1/nodes/{name}/key", timeout=5, headers=admin)
            assert key.status_code == 200, key.text  # the agent registered its public key
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


def test_a_restarted_agent_service_keeps_its_key_and_is_taken(
    agents: dict[str, dict[str, Any]], live_service: str, tmp_path: Path, secrets_dir: Path
) -> None:
    """One agent service's command as shipped, started, stopped and started again on the
    same key volume: the second run signs with the key the service registered."""
    service = next(iter(agents.values()))
    admin = {"Authorization": f"Bearer {(secrets_dir / 'admin.token').read_text().strip()}"}
    env = {
        **os.environ,
        **environment(service),
        "TOPOPLACE_AGENT_SERVER": live_service,
        "TOPOPLACE_AGENT_INTERVAL_S": "0.2",
        "TOPOPLACE_AGENT_TOKEN_FILE": environment(service)["TOPOPLACE_AGENT_TOKEN_FILE"].replace(
            "/secrets", str(secrets_dir)
        ),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    }
    name = environment(service)["TOPOPLACE_AGENT_NODE_NAME"]
    key_dir = tmp_path / "volume"
    script = _script(service, key_dir)
    seqs, keys = [], []
    for _ in range(2):
        proc = subprocess.Popen(["sh", "-c", script], env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, "the agent exited"
                assert time.monotonic() < deadline, "the node was never reported"
                node = httpx.get(f"{live_service}/v1/nodes/{name}", timeout=5, headers=admin)
                if node.status_code == 200 and (not seqs or node.json()["seq"] > seqs[-1]):
                    break
                time.sleep(0.1)
            seqs.append(node.json()["seq"])
            keys.append((key_dir / "node.key.pub").read_text().strip())
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    assert keys[0] == keys[1]
    stored = httpx.get(f"{live_service}/v1/nodes/{name}/key", timeout=5, headers=admin).json()
    assert stored["public_key"] == keys[0]
    assert seqs[1] > seqs[0]  # the restarted agent's signed snapshot was taken
