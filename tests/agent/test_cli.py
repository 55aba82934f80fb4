"""`topoplace agent` and `topoplace agent keygen` from the command line."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.signing import NodeKey
from placement.profiles import build_profile
from placement.topo_text import render_topo_matrix
from topoplace.cli import main

TOPOLOGIES = Path(__file__).resolve().parents[3] / "shared" / "data" / "topologies"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TOPOPLACE_AGENT_SERVER", "TOPOPLACE_AGENT_KEY_FILE", "TOPOPLACE_AGENT_CONFIG"):
        monkeypatch.delenv(name, raising=False)


def test_once_prints_the_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["agent", "--source", "sim:dgx1-v100", "--node-name", "n1", "--label", "a=b", "--once"]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["name"] == "n1" and out["labels"] == {"a": "b"} and len(out["gpus"]) == 8


def test_once_from_saved_topology_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # A real `nvidia-smi topo -m` output where the shared data is checked out,
    # else the same machine's matrix as the tool prints it.
    saved = TOPOLOGIES / "hgx-h100.txt"
    if not saved.is_file():
        saved = tmp_path / "hgx-h100.txt"
        saved.write_text(render_topo_matrix(build_profile("hgx-h100", "h1")), encoding="utf-8")
    source = f"smi:{saved}"
    code = main(["agent", "--source", source, "--node-name", "h1", "--gpu-model", "H100", "--once"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["links"][0][1] == "NV18" and out["gpus"][0]["model"] == "H100"


def test_fake_nvml_source_runs_discovery(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--source", "fake:hgx-h100", "--node-name", "n1", "--once"]) == 0
    assert json.loads(capsys.readouterr().out)["links"][0][1] == "NVS18"


def test_nvml_missing_is_a_clear_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver")
    code = main(["agent", "--node-name", "n1", "--once"])
    err = capsys.readouterr().err
    assert code == 4
    assert err.startswith("topoplace agent: NVML cannot be initialised") and "Traceback" not in err


def test_bad_settings_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["agent", "--source", "sim:hgx-h100", "--node-name", "Bad Name", "--once"]) == 2
    assert "node_name (command line)" in capsys.readouterr().err
    assert main(["agent", "--source", "sim:hgx-h100", "--node-name", "n1"]) == 2
    assert "--server" in capsys.readouterr().err
    args = [
        "agent",
        "--source",
        "sim:hgx-h100",
        "--node-name",
        "n1",
        "--server",
        "http://127.0.0.1:9",
    ]
    assert main(args) == 2
    assert "keygen" in capsys.readouterr().err
    assert main([*args, "--key-file", str(tmp_path / "none.key")]) == 2
    assert "cannot read the key file" in capsys.readouterr().err
    assert main(["agent", "--source", "bogus", "--node-name", "n1", "--once"]) == 4
    assert "is not one of" in capsys.readouterr().err


def test_once_against_an_unreachable_service_exits_3(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key = tmp_path / "node.key"
    NodeKey.generate().save(key)
    args = ["agent", "--source", "sim:hgx-h100", "--node-name", "n1", "--key-file", str(key)]
    assert main([*args, "--server", "http://127.0.0.1:9", "--timeout", "2", "--once"]) == 3
    assert "cannot reach topoplace" in capsys.readouterr().err


def test_keygen(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "node.key"
    assert main(["agent", "keygen", "--key-file", str(path)]) == 0
    public = capsys.readouterr().out.splitlines()[-1]
    assert (
        NodeKey.load(path).public_key == public == (tmp_path / "node.key.pub").read_text().strip()
    )
    assert main(["agent", "keygen", "--key-file", str(path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert main(["agent", "keygen", "--key-file", str(path), "--force"]) == 0
    assert main(["agent", "keygen"]) == 2


def test_daemon_outlives_an_absent_service_and_stops_on_sigterm(tmp_path: Path) -> None:
    key = tmp_path / "node.key"
    NodeKey.generate().save(key)
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOPOPLACE_AGENT_")}
    env["TOPOPLACE_AGENT_BACKOFF_INITIAL_S"] = "0.05"
    env["TOPOPLACE_AGENT_BACKOFF_MAX_S"] = "0.2"
    command = [
        sys.executable,
        "-m",
        "topoplace",
        "agent",
        "--server",
        f"http://127.0.0.1:{port}",
        "--key-file",
        str(key),
        "--source",
        "sim:pcie-8x-l40s",
        "--node-name",
        "n1",
    ]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(process, lines), daemon=True).start()
    err: list[str] = []
    try:
        # SIGTERM only once the daemon has failed to reach the service three times:
        # its handler is installed by then, however long the interpreter took to start.
        while sum("cannot reach topoplace" in line for line in err) < 3:
            line = _next_line(lines)
            assert line is not None, f"the agent exited while the service was down: {err}"
            err.append(line)
        assert process.poll() is None, "the agent exited while the service was down"
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)  # the reader drains stderr meanwhile: no full pipe
        while (line := _next_line(lines)) is not None:
            err.append(line)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = "".join(err)
    assert process.returncode == 0
    assert "Traceback" not in text
    assert "agent for node n1 stopped" in text


def _read_lines(process: subprocess.Popen[str], into: queue.Queue[str | None]) -> None:
    """Hand the process's stderr over line by line, then None when it closes."""
    assert process.stderr is not None
    for line in process.stderr:
        into.put(line)
    into.put(None)


def _next_line(lines: queue.Queue[str | None], timeout_s: float = 60) -> str | None:
    """The next stderr line, or None at its end; the deadline is for a hung daemon only."""
    try:
        return lines.get(timeout=timeout_s)
    except queue.Empty:
        pytest.fail(f"the agent wrote nothing for {timeout_s:g} s")
