"""The workload mix file: the sim writes it, the service reads it at start, and every
engine state the service builds ranks by it; a bad one stops `serve` in one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from placement import ClusterState
from placement.profiles import build_profile
from placement.workload_mix import WorkloadMix, WorkloadMixError
from service import migrate
from service.app import create_app
from service.nodes.loadable import _probe, check_loadable
from service.settings import Settings
from service.workload_mix import MAX_FILE_BYTES, read_workload_mix
from tests.service.conftest import ADMIN_TOKEN, FakeClock, secured
from tests.service.helpers import add_nodes
from topoplace.cli import main
from topoplace.sim.jobs import read_trace
from topoplace.sim.policies import EnginePolicy, build_policies

# Two of three GPUs asked insist on V100s: the mix a month of these jobs makes.
TRACE = """name,gpus,gpu_models,cpu_milli,memory_mib
a,1,V100,4000,8192
b,1,V100,4000,8192
c,1,,2000,4096
"""


@pytest.fixture
def mix_file(tmp_path: Path) -> Path:
    """The mix `topoplace sim --write-mix` writes for TRACE."""
    trace = tmp_path / "jobs.csv"
    trace.write_text(TRACE)
    out = tmp_path / "mix.json"
    args = ["sim", "--trace", str(trace), "--cluster", "1xdgx1-v100", "--policies", "topoplace"]
    assert main([*args, "--no-progress", "--write-mix", str(out)]) == 0
    return out


def test_the_file_holds_exactly_what_the_sim_hands_the_engine(mix_file: Path) -> None:
    jobs = list(read_trace(mix_file.parent / "jobs.csv").jobs)
    snaps = [build_profile("dgx1-v100", "n0")]
    (engine,) = build_policies(["topoplace"], snaps, jobs)
    assert isinstance(engine, EnginePolicy)
    read = read_workload_mix(str(mix_file))
    assert ClusterState.from_mix(read).mix == engine.state.mix
    assert read.model_demand == {("V100",): 2.0, (): 1.0}
    assert read.host_mix == (10000 / 3, 20480 / 3)


def _client(settings: Settings, clock: FakeClock) -> TestClient:
    app = create_app(secured(settings), clock=clock, background=False)
    return TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})


def _chosen(settings: Settings, clock: FakeClock) -> str:
    """Where a request that runs anywhere goes, beside a V100 box with 6 of 8 held."""
    with _client(settings, clock) as client:
        add_nodes(client, ("dgx1-v100", "v100"), ("pcie-8x-l40s", "l40s"))
        held = client.post("/v1/place", json={"gpus": 6, "nodes": ["v100"]})
        assert held.status_code == 201, held.text
        answer = client.post("/v1/place", json={"gpus": 1})
        assert answer.status_code == 201, answer.text
        node: str = answer.json()["tasks"][0]["node"]
        return node


def test_without_a_file_the_mix_is_observed(settings: Settings, clock: FakeClock) -> None:
    # Observed, nothing has named a model yet: the request packs beside the 6 held.
    assert _chosen(settings, clock) == "v100"


def test_the_service_ranks_by_the_configured_mix_from_the_first_request(
    settings: Settings, clock: FakeClock, mix_file: Path
) -> None:
    configured = settings.model_copy(update={"workload_mix_file": str(mix_file)})
    # The trace's V100 demand presses the V100s: what runs anywhere leaves them.
    assert _chosen(configured, clock) == "l40s"


def test_every_state_the_service_builds_gets_the_mix(
    settings: Settings, mix_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    configured = settings.model_copy(update={"workload_mix_file": str(mix_file)})
    with caplog.at_level(logging.INFO, logger="topoplace.state"):
        app = create_app(configured, background=False)
    assert (
        f"ranking by the workload mix in {mix_file} (configured: size_mix, host_mix,"
        " task_mix, model_demand; left as without a file: none)"
    ) in caplog.messages
    state = app.state.service
    expected = ClusterState.from_mix(read_workload_mix(str(mix_file))).mix
    assert state.cluster.mix == expected
    migrate.upgrade(configured.database_url)
    state.load()  # the start's rebuild from the database
    assert state.cluster.mix == expected
    # The probe that checks a reported snapshot loads it into a state built the same way.
    check_loadable(build_profile("dgx1-v100", "probe"), state.cluster)
    assert _probe.cluster is not None and _probe.cluster.mix == expected


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (None, "cannot read the workload mix file"),
        (b"\xff\xfe", "not UTF-8 text"),
        (b"x" * (MAX_FILE_BYTES + 1), f"larger than {MAX_FILE_BYTES} bytes"),
        (b'{"version": 1, "task_mix": [{"gpus": 0}]}', "task_mix[0]"),
    ],
)
def test_a_bad_file_is_named_with_its_field(
    tmp_path: Path, content: bytes | None, named: str
) -> None:
    path = tmp_path / "mix.json"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(WorkloadMixError) as caught:
        read_workload_mix(str(path))
    message = str(caught.value)
    assert named in message and str(path) in message and "TOPOPLACE_WORKLOAD_MIX_FILE" in message
    assert "\n" not in message
    assert read_workload_mix(None) == WorkloadMix()


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_serve_with_a_bad_file_exits_2_in_one_line(tmp_path: Path, how: str) -> None:
    bad = tmp_path / "mix.json"
    bad.write_text('{"version": 1, "model_demand": [{"models": ["T4"], "gpus": -1}]}')
    env = {
        **os.environ,
        "TOPOPLACE_DATABASE_URL": f"sqlite:///{tmp_path / 'serve.sqlite3'}",
        "TOPOPLACE_INSECURE_DEV": "1",
    }
    command = [sys.executable, "-m", "topoplace", "serve", "--no-grpc", "--port", "1"]
    if how == "flag":
        command += ["--workload-mix", str(bad)]
    else:
        env["TOPOPLACE_WORKLOAD_MIX_FILE"] = str(bad)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert (
        lines[0].startswith("error: the workload mix file") and "model_demand[0].gpus" in lines[0]
    )
