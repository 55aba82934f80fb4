"""`topoplace export` against a real service: what it writes, and a write that fails."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from topoplace.cli import main


def test_export_writes_every_node(server: str, tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    assert main(["export", "--server", server, "-o", str(out)]) == 0
    assert json.loads(out.read_text())["nodes"]
    assert [p.name for p in tmp_path.iterdir()] == ["fleet.json"]


def test_an_output_that_cannot_be_written_is_exit_2(
    server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Was a FileNotFoundError traceback, exit 1.
    out = tmp_path / "missing" / "fleet.json"
    assert main(["export", "--server", server, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: -o: cannot write {out}: No such file or directory\n"


def _small_file_limit() -> None:
    # Writes past 4 KiB fail with EFBIG, as on a full disk (SIGXFSZ ignored: an error).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))


def test_a_write_that_fails_midway_leaves_the_old_file(server: str, tmp_path: Path) -> None:
    # Was: the old fleet.json truncated to its first 4096 bytes of new JSON, and a
    # traceback (OSError: [Errno 27] File too large), exit 1.
    out = tmp_path / "fleet.json"
    out.write_text('{"nodes": []}\n')
    result = subprocess.run(
        [sys.executable, "-m", "topoplace", "export", "--server", server, "-o", str(out)],
        capture_output=True,
        text=True,
        preexec_fn=_small_file_limit,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"error: -o: cannot write {out}: File too large\n"
    assert out.read_text() == '{"nodes": []}\n'
    assert [p.name for p in tmp_path.iterdir()] == ["fleet.json"]
