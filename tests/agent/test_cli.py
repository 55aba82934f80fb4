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
from topoplace.cli import main
from topoplace_client.samples import sample_text


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
    # The shipped sample of a real `nvidia-smi topo -m` output, as a file.
    saved = tmp_path / "hgx-h100.txt"
    saved.write_text(sample_text("hgx-h100"), encoding="utf-8")
    source = f"smi:{saved}"
    code = main(["agent", "--source", source, "--node-name", "h1", "--gpu-model", "H100", "--once"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["links"][0][1] == "NV18" and out["gpus"][0]["model"] == "H100"


def test_once_from_a_sample_by_name_warns_of_unknown_model_and_memory(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    args = ["agent", "--source", "smi:dgx1-v100", "--node-name", "d1", "--once"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["numa_nodes"] == [{"id": 0, "cpus": "0-19,40-59", "memory_mib": 0}]
    assert "--gpu-model MODEL" in caplog.text and "--gpu-memory-mib MIB" in caplog.text
    caplog.clear()
    given = [*args, "--gpu-model", "Tesla V100-SXM2-32GB", "--gpu-memory-mib", "32768"]
    assert main(given) == 0
    gpus = json.loads(capsys.readouterr().out)["gpus"]
    assert {(g["model"], g["memory_mib"]) for g in gpus} == {("Tesla V100-SXM2-32GB", 32768)}
    assert "--gpu-model" not in caplog.text


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
    assert main(["agent", "--source", "bogus", "--node-name", "n1", "--once"]) == 2
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


def test_library_loggers_are_quiet_unless_debugging() -> None:
    import logging

    httpx_log = logging.getLogger("httpx")
    httpx_log.setLevel(logging.NOTSET)
    assert main(["agent", "--source", "sim:hgx-h100", "--node-name", "n1", "--once"]) == 0
    assert httpx_log.getEffectiveLevel() == logging.WARNING
    args = ["agent", "--source", "sim:hgx-h100", "--node-name", "n1", "--once"]
    httpx_log.setLevel(logging.NOTSET)
    assert main([*args, "--log-level", "DEBUG"]) == 0
    assert httpx_log.level == logging.NOTSET
