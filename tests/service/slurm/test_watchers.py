"""The background loop's Slurm reads run side by side: a slow squeue does not hold up
sinfo, and neither command is read twice at once (service/slurm/watchers.py); a read
under way when the service stops is killed, not waited for (json_command.py)."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings
from tests.service.slurm.test_node_states import DOWN

SQUEUE_S = 2.0  # each squeue read takes this long, well past sinfo's interval
HANG_S = 15  # a read that hangs: longer than either timeout below


def _script(path: Path, log: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\necho start >> {log}\n{body}\necho end >> {log}\n")
    path.chmod(0o755)
    return str(path)


def _overlapped(log: Path) -> bool:
    """Whether a read started before the one before it ended."""
    lines = log.read_text().split() if log.exists() else []
    return any(a == b == "start" for a, b in itertools.pairwise(lines))


def test_a_slow_squeue_does_not_hold_up_the_node_states(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    squeue_log, sinfo_log = tmp_path / "squeue.log", tmp_path / "sinfo.log"
    squeue = _script(tmp_path / "squeue", squeue_log, f"sleep {SQUEUE_S}\necho '{{\"jobs\": []}}'")
    sinfo = _script(tmp_path / "sinfo", sinfo_log, f"cat {DOWN}\nsleep 0.3")
    monkeypatch.setenv("TOPOPLACE_SLURM_SQUEUE_COMMAND", squeue)
    monkeypatch.setenv("TOPOPLACE_SLURM_RECONCILE_INTERVAL_S", "0.1")  # always due
    monkeypatch.setenv("TOPOPLACE_SLURM_SINFO_COMMAND", sinfo)
    monkeypatch.setenv("TOPOPLACE_SLURM_NODES_INTERVAL_S", "0.1")  # always due
    app = create_app(settings)
    service: Any = app.state.service
    with TestClient(app):
        started = time.monotonic()
        while not service.slurm_nodes.unavailable() and time.monotonic() - started < 10:
            time.sleep(0.05)
        read_after = time.monotonic() - started
        time.sleep(SQUEUE_S * 1.5)  # squeue ends a read and starts the next
    assert set(service.slurm_nodes.unavailable()) == {"node1", "node2"}
    assert read_after < SQUEUE_S / 2, f"sinfo read only after {read_after:.1f} s"
    squeue_reads = squeue_log.read_text().split().count("start")
    sinfo_reads = sinfo_log.read_text().split().count("start")
    assert squeue_reads >= 2 and sinfo_reads > 3 * squeue_reads, (squeue_reads, sinfo_reads)
    assert not _overlapped(squeue_log) and not _overlapped(sinfo_log)


def _running(pid: int) -> bool:
    """Whether the process runs: gone, or a zombie (ended, its parent not yet told), not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_read_under_way_at_shutdown_is_killed_not_waited_for(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """squeue and sinfo on PATH that hang: the service stops at once and leaves neither
    running, nor what they started (a wrapper script's real command). Was: the stop
    waited for each read's timeout (squeue's 20 s by default), then for what the
    command had started."""
    bin_dir, pids = tmp_path / "bin", tmp_path / "pids"
    bin_dir.mkdir()
    for name in ("squeue", "sinfo"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\nsleep {HANG_S} &\necho $$ $! >> {pids}\nwait\n")
        script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    for name in ("SQUEUE", "SINFO"):
        monkeypatch.setenv(f"TOPOPLACE_SLURM_{name}_COMMAND", "auto")  # found on PATH
        monkeypatch.setenv(f"TOPOPLACE_SLURM_{name}_TIMEOUT_S", str(HANG_S - 5))
    app = create_app(settings)
    with TestClient(app):
        started = time.monotonic()
        while len(_lines(pids)) < 2 and time.monotonic() - started < 10:
            time.sleep(0.05)
        assert len(_lines(pids)) == 2, _lines(pids)  # both reads under way
        stopping = time.monotonic()
    took = time.monotonic() - stopping
    left = [int(pid) for line in _lines(pids) for pid in line.split() if _running(int(pid))]
    # Killed at once: well under the reads' 10 s timeout, which the stop used to wait for
    # (the margin is a slow machine's).
    assert took < 6.0, f"the service took {took:.1f} s to stop"
    assert left == [], f"still running: {left}"


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
