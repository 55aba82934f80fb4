"""One test per exit status of `topoplace agent`, and the table that lists them all.

The table is ``agent.cli.EXIT_CODES``; docs/agent.md and ``--help`` show it,
and the tests below hold each code to what the table says.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.cli import EXIT_CODES
from agent.signing import NodeKey
from service.app import create_app
from service.settings import Settings
from tests.live_server import live_server
from topoplace.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TOPOPLACE_AGENT_SERVER", "TOPOPLACE_AGENT_KEY_FILE", "TOPOPLACE_AGENT_CONFIG"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'service.db'}")
    with live_server(create_app(settings)) as url:
        yield url


def key_file(tmp_path: Path, name: str = "node.key") -> Path:
    path = tmp_path / name
    NodeKey.generate().save(path)
    return path


def test_the_docs_and_help_show_every_code(capsys: pytest.CaptureFixture[str]) -> None:
    docs = (ROOT / "docs" / "agent.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (\d) \| (.+?) \|$", docs, re.MULTILINE))
    assert {int(code) for code in rows} == set(EXIT_CODES)
    with pytest.raises(SystemExit):
        main(["agent", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for code, meaning in EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in help_text


def test_0_done(capsys: pytest.CaptureFixture[str], server: str, tmp_path: Path) -> None:
    args = ["agent", "--source", "sim:hgx-h100", "--node-name", "n0"]
    assert main([*args, "--once"]) == 0
    assert main([*args, "--server", server, "--key-file", str(key_file(tmp_path)), "--once"]) == 0
    assert "snapshot seq" in capsys.readouterr().out


def test_1_refused_key_conflict(
    capsys: pytest.CaptureFixture[str], server: str, tmp_path: Path
) -> None:
    args = ["agent", "--server", server, "--source", "sim:hgx-h100", "--node-name", "n1", "--once"]
    assert main([*args, "--key-file", str(key_file(tmp_path, "first.key"))]) == 0
    other = key_file(tmp_path, "other.key")
    assert main([*args, "--key-file", str(other)]) == 1
    err = capsys.readouterr().err
    assert f"topoplace node-key n1 --register @{other}.pub --replace" in err


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("sim:nope", "unknown profile 'nope'"),
        ("fake:nope", "unknown profile 'nope'"),
        ("bogus", "is not one of"),
        ("smi:/no/such/file.txt", "no such file"),
    ],
)
def test_2_bad_source(capsys: pytest.CaptureFixture[str], source: str, says: str) -> None:
    assert main(["agent", "--source", source, "--node-name", "n1", "--once"]) == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_2_garbage_topology_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    garbage = tmp_path / "topo.txt"
    garbage.write_text("not a matrix\n", encoding="utf-8")
    assert main(["agent", "--source", f"smi:{garbage}", "--node-name", "n1", "--once"]) == 2
    assert "line 1: expected a header" in capsys.readouterr().err


def test_2_bad_settings(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agent", "--source", "sim:hgx-h100", "--node-name", "Bad Name", "--once"]) == 2
    assert "node_name (command line)" in capsys.readouterr().err


def test_3_unreachable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["agent", "--source", "sim:hgx-h100", "--node-name", "n1"]
    args += ["--key-file", str(key_file(tmp_path)), "--server", "http://127.0.0.1:9"]
    assert main([*args, "--timeout", "2", "--once"]) == 3
    assert "cannot reach topoplace" in capsys.readouterr().err


def test_3_rate_limited(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # The service's own limiter: the first --once's two requests, then nothing for 1000 s.
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'service.db'}",
        rate_limit_per_s=0.001,
        rate_limit_burst=2,
    )
    args = ["agent", "--source", "sim:hgx-h100", "--node-name", "n1", "--once"]
    args += ["--key-file", str(key_file(tmp_path))]
    with live_server(create_app(settings)) as url:
        assert main([*args, "--server", url]) == 0
        capsys.readouterr()
        # Was 1, as for a refusal: a wrapper could not tell "try later" from "fix it".
        assert main([*args, "--server", url]) == 3
    err = capsys.readouterr().err
    assert "rate_limited" in err and "try again later (Retry-After: 1000)" in err


def test_4_discovery_cannot_start(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pytest.skip("this machine has an NVIDIA driver, so NVML discovery starts")
    assert main(["agent", "--node-name", "n1", "--once"]) == 4
    assert "NVML cannot be initialised" in capsys.readouterr().err


@pytest.mark.parametrize("source", ["sim:nope", "bogus", "smi:/no/such/file.txt"])
def test_2_bad_source_for_the_device_plugin_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, source: str
) -> None:
    args = ["device-plugin", "--source", source, "--node-name", "n1"]
    args += ["--server", "http://127.0.0.1:9", "--kubelet-dir", str(tmp_path)]
    assert main(args) == 2
    assert "--source" in capsys.readouterr().err


def test_2_a_relative_driver_root_for_the_device_plugin(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The kubelet takes a device spec's host path as given: a relative one names nothing.
    args = ["device-plugin", "--source", "sim:hgx-h100", "--node-name", "n1"]
    args += ["--server", "http://127.0.0.1:9", "--kubelet-dir", str(tmp_path)]
    assert main([*args, "--driver-root", "run/nvidia/driver"]) == 2
    assert "--driver-root 'run/nvidia/driver' is not an absolute path" in capsys.readouterr().err
