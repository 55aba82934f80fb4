"""Running one of Slurm's JSON commands (``squeue --json``, ``sinfo --json``)."""

from __future__ import annotations

import json
import shlex
import subprocess
from typing import Any


def run_json_command(command: str, timeout_s: float) -> Any:
    """The command's standard output as JSON; raises RuntimeError saying what failed
    (the command missing or timed out, its exit status and error text, output that
    is no JSON), which the background loops log and count."""
    try:
        done = subprocess.run(
            shlex.split(command), capture_output=True, timeout=timeout_s, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"{command!r} failed: {exc}") from exc
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip()[:300]
        raise RuntimeError(f"{command!r} exited {done.returncode}: {err}")
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise RuntimeError(f"{command!r} printed no JSON: {exc}") from exc
