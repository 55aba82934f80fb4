"""docker-compose.yml and the Dockerfile, checked without a Docker engine.

The compose checks need PyYAML and are skipped without it. The simulated
agents' inline script is also run against a real service (SQLite, in a
thread), since nothing here can start the compose stack itself.
"""

from __future__ import annotations

import ast
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from placement.profiles import build_profile, profile_names

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
def agent_script(services: dict[str, Any]) -> str:
    command = services["demo-agents"]["command"]
    assert command[:2] == ["python", "-c"], command
    script: str = command[2]
    return script


def test_the_three_services_exist(services: dict[str, Any]) -> None:
    assert {"postgres", "topoplace", "demo-agents"} <= set(services)


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


def test_agents_script_compiles_and_names_known_profiles(
    services: dict[str, Any], agent_script: str
) -> None:
    agents = services["demo-agents"]
    assert agents["depends_on"]["topoplace"]["condition"] == "service_healthy"
    assert environment(agents)["TOPOPLACE_URL"] == "http://topoplace:8080"
    # Compose would substitute anything after a `$`; the script must not have one.
    assert "$" not in agent_script
    compile(agent_script, "agents", "exec")
    fleet = _fleet(ast.parse(agent_script))
    assert len(fleet) >= 4
    assert {profile for profile, _ in fleet} <= set(profile_names())
    assert len({name for _, name in fleet}) == len(fleet)


def _fleet(tree: ast.Module) -> list[tuple[str, str]]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "FLEET" for t in node.targets
        ):
            fleet: list[tuple[str, str]] = ast.literal_eval(node.value)
            return fleet
    raise AssertionError("the agents script has no FLEET = [(profile, node name), ...]")


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


@pytest.fixture
def live_service(tmp_path: Path) -> Iterator[str]:
    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    settings = Settings(database_url=f"sqlite:///{tmp_path / 'agents.sqlite3'}")
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


def test_agents_script_reports_and_heartbeats(
    agent_script: str, live_service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOPOPLACE_URL", live_service)
    agents: dict[str, Any] = {"__name__": "agents"}  # not __main__: define, do not loop
    exec(compile(agent_script, "agents", "exec"), agents)
    call, fleet = agents["call"], agents["FLEET"]

    for profile, name in fleet:
        agents["report"](profile, name)
    nodes = {n["name"]: n for n in call("GET", "/v1/nodes")["nodes"]}
    assert set(nodes) == {name for _, name in fleet}
    assert all(n["state"] == "ready" for n in nodes.values())

    profile, name = fleet[0]
    agents["heartbeat"](profile, name)
    # A restarted agent whose seq counter went back goes past the stored seq.
    snapshot = json.loads(build_profile(profile, name, seq=7).model_dump_json())
    call("PUT", f"/v1/nodes/{name}/snapshot", {"snapshot": snapshot})
    agents["report"](profile, name)
    assert call("GET", f"/v1/nodes/{name}")["seq"] == 8
    # A node the service forgot is reported again on its next heartbeat.
    call("DELETE", f"/v1/nodes/{name}")
    agents["heartbeat"](profile, name)
    assert call("GET", f"/v1/nodes/{name}")["state"] == "ready"
