"""Running one of Slurm's JSON commands (``squeue --json``, ``sinfo --json``).

The command runs as an asyncio subprocess awaited on the event loop, not in a
worker thread: a read cancelled (the service shutting down) kills it at once.
Run from a worker thread, a read under way at shutdown ran to its timeout
(squeue's 20 s), because the loop's close waits for its worker threads and a
thread cannot be cancelled. The child leads a process group of its own, and
the whole group is killed: a wrapper script (``ssh host squeue --json``, a
shell script) must not leave the real command running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
from typing import Any

from service.event_loop import off_loop


async def run_json_command(command: str, timeout_s: float) -> Any:
    """The command's standard output as JSON; raises RuntimeError saying what failed
    (the command missing or timed out, its exit status and error text, output that
    is no JSON), which the background loops log and count. Cancelled, or past
    ``timeout_s``, the command is killed (its process group) before this returns."""
    try:
        child = await asyncio.create_subprocess_exec(
            *shlex.split(command),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, killed whole below
        )
    except OSError as exc:
        raise RuntimeError(f"{command!r} failed: {exc}") from exc
    done = False
    try:
        stdout, stderr = await asyncio.wait_for(child.communicate(), timeout_s)
        done = True
    except TimeoutError:
        raise RuntimeError(f"{command!r} failed: timed out after {timeout_s:g} seconds") from None
    finally:
        if not done:  # cancelled or timed out
            _kill_group(child.pid)
            # Reaped here, once killed: a zombie per cancelled read would pile up.
            await child.wait()
    if child.returncode != 0:
        err = stderr.decode(errors="replace").strip()[:300]
        raise RuntimeError(f"{command!r} exited {child.returncode}: {err}")
    try:
        # Off the loop: a busy cluster's squeue prints megabytes.
        return await off_loop(json.loads, stdout)
    except ValueError as exc:
        raise RuntimeError(f"{command!r} printed no JSON: {exc}") from exc


def _kill_group(pid: int) -> None:
    """SIGKILL the command's process group: the command, and whatever it started that
    still runs (a script's own squeue, sleep)."""
    # ProcessLookupError: the group is gone, the command ended with nothing left behind.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
