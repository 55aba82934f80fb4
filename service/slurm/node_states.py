"""Which nodes Slurm will not start jobs on now, read from ``sinfo --json``.

The filter must not pin a job to a node Slurm has down, drained or draining,
failed, in a reservation (maintenance or another) or not responding: the job would wait
there, pending with ``ReqNodeNotAvail``, holding its reservation, while other
nodes sit idle. The topoplace agent on such a node may still report it
healthy (a drain is an administrator's decision, not a fault the agent sees).

Slurm 22.05.8's ``sinfo --json`` (API v0.0.38) gives each node a base
``state`` (``idle``, ``mixed``, ``allocated``, ``down``, ...) and a list of
``state_flags`` (``DRAIN``, ``FAIL``, ``MAINTENANCE``, ``NOT_RESPONDING``,
``RESERVED``, ...); later API versions give ``state`` as a list holding both.
``sinfo -o %T`` folds them into one word with suffixes (``drained``,
``draining``, ``idle*`` for not responding, ``maint``), so the JSON is read.

Only Slurm job submissions consult this (service/slurm/service.py): /place
serves callers other than Slurm, for which a Slurm drain says nothing, and
the service's own cordon is the way to keep them off a node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from service.slurm.json_command import run_json_command

# Base states and flags (upper case) after which Slurm starts no job on the node.
# RESERVED: in an advance reservation now, where Slurm starts only the jobs that name
# it (--reservation), and those the filter leaves to Slurm (service.py).
UNAVAILABLE_STATES = frozenset({"DOWN"})
UNAVAILABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "MAINT",
        "MAINTENANCE",
        "NOT_RESPONDING",
        "RESERVED",
    }
)
# A read is trusted this long when the next ones fail: a slurmctld that does not
# answer takes no submissions either, and once it is back a stale read would keep
# nodes out that came back meanwhile (or pin jobs to nodes drained since).
STALE_AFTER_S = 30.0


class SinfoError(ValueError):
    """The text is not what ``sinfo --json`` prints."""


def unavailable_nodes(sinfo: Any) -> dict[str, str]:
    """Node name -> why Slurm starts no job there now (``idle+DRAIN: disk check``)."""
    if not isinstance(sinfo, dict) or not isinstance(sinfo.get("nodes"), list):
        raise SinfoError("expected the output of `sinfo --json`: an object with a 'nodes' list")
    if errors := sinfo.get("errors"):
        # Like squeue, sinfo exits 0 with an empty list when slurmctld does not answer.
        raise SinfoError(f"sinfo could not read the nodes: {str(errors)[:300]}")
    out: dict[str, str] = {}
    for node in sinfo["nodes"]:
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            continue
        words = _words(node.get("state")) + _words(node.get("state_flags"))
        if any(w.upper() in UNAVAILABLE_STATES | UNAVAILABLE_FLAGS for w in words):
            reason = str(node.get("reason") or "").strip()
            state = "+".join(words)
            out[node["name"]] = f"{state}: {reason}" if reason else state
    return out


def _words(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list):
        return [str(v) for v in value if v]
    return []


async def read_sinfo(command: str, timeout_s: float) -> dict[str, str]:
    """Run the configured command; raises RuntimeError saying what failed. Cancelled (the
    service shutting down), it kills the command (json_command.py)."""
    sinfo = await run_json_command(command, timeout_s)
    try:
        return unavailable_nodes(sinfo)
    except ValueError as exc:  # SinfoError
        raise RuntimeError(f"{command!r}: {exc}") from exc


class SlurmNodeStates:
    """The latest read: shared by the background loop (writes) and the filter (reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._unavailable: Mapping[str, str] = {}
        self._read_at = float("-inf")

    def update(self, unavailable: Mapping[str, str]) -> None:
        with self._lock:
            self._unavailable = dict(unavailable)
            self._read_at = time.monotonic()

    def unavailable(self) -> Mapping[str, str]:
        """Nodes Slurm starts no job on now; none when the last read is too old."""
        with self._lock:
            if time.monotonic() - self._read_at > STALE_AFTER_S:
                return {}
            return self._unavailable
