"""Running one of Slurm's JSON commands (``squeue --json``, ``sinfo --json``), and
decoding their output (:func:`parsed`), the service's own reads and a pushed one alike.

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
import re
import shlex
import signal
from typing import Any

from service.edge.json_scan import MAX_DEPTH, too_deep
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
        return await parsed(stdout)
    except ValueError as exc:
        raise RuntimeError(f"{command!r} printed no JSON: {exc}") from exc


def _kill_group(pid: int) -> None:
    """SIGKILL the command's process group: the command, and whatever it started that
    still runs (a script's own squeue, sleep)."""
    # ProcessLookupError: the group is gone, the command ended with nothing left behind.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class TooDeep(ValueError):
    """The document nests deeper than :data:`MAX_DEPTH` levels."""


async def parsed(raw: bytes) -> Any:
    """``raw`` decoded as JSON on a worker thread, piece by piece (:func:`parse_json`): a
    busy cluster's squeue prints megabytes, whether the service reads it or cron pushes it
    (POST /v1/slurm/reconcile). Raises ValueError as json.loads does, TooDeep included."""
    return await off_loop(parse_json, raw)


_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
_TOO_DEEP = f"JSON nested deeper than {MAX_DEPTH} levels"


def parse_json(raw: bytes) -> Any:
    """``raw`` decoded as json.loads decodes it; an object one member at a time, and the
    arrays it holds (squeue's ``jobs``) one element at a time.

    Why: json.loads holds the GIL for the whole document, so from a worker thread it
    stalls the event loop as much as on it (a 20 MB squeue answer, 6,000 jobs: 125 ms).
    Between pieces the thread gives the GIL back at Python's switch interval (5 ms).
    Each piece is checked for depth on its own text: the request guard's check of a
    whole body (json_scan) would hold the loop 330 ms for those 20 MB. A document that
    is no object (neither caller takes one), or anything irregular, is decoded whole,
    for json.loads's own answer or error."""
    text = raw.decode(json.detect_encoding(raw), "surrogatepass")  # as json.loads(bytes)
    at = _skip(text, 0)
    if not text.startswith("{", at):
        return _whole(text)
    document: dict[str, Any] = {}
    at = _skip(text, at + 1)
    if text.startswith("}", at):
        return document if _skip(text, at + 1) == len(text) else _whole(text)
    try:
        while True:
            key, at = _piece(text, at, 1)
            at = _skip(text, at)
            if not isinstance(key, str) or not text.startswith(":", at):
                return _whole(text)
            at = _skip(text, at + 1)
            if text.startswith("[", at):
                document[key], at = _array(text, at)
            else:
                document[key], at = _piece(text, at, 1)
            at = _skip(text, at)
            if not text.startswith(",", at):
                break
            at = _skip(text, at + 1)
    except json.JSONDecodeError:
        return _whole(text)
    if not text.startswith("}", at) or _skip(text, at + 1) != len(text):
        return _whole(text)
    return document


def _array(text: str, at: int) -> tuple[list[Any], int]:
    """The array at ``at``, a member of the top object, element by element."""
    items: list[Any] = []
    at = _skip(text, at + 1)
    if text.startswith("]", at):
        return items, at + 1
    while True:
        item, at = _piece(text, at, 2)
        items.append(item)
        at = _skip(text, at)
        if text.startswith("]", at):
            return items, at + 1
        if not text.startswith(",", at):
            raise json.JSONDecodeError("Expecting ',' delimiter", text, at)
        at = _skip(text, at + 1)


def _piece(text: str, at: int, level: int) -> tuple[Any, int]:
    """The JSON value at ``at``, inside ``level`` containers, and where it ends."""
    try:
        value, end = _DECODER.raw_decode(text, at)
    except RecursionError:
        raise TooDeep(_TOO_DEEP) from None
    if too_deep(text[at:end].encode("utf-8", "surrogatepass"), MAX_DEPTH - level):
        raise TooDeep(_TOO_DEEP)
    return value, end


def _whole(text: str) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep(_TOO_DEEP) from None


def _skip(text: str, at: int) -> int:
    """Past the whitespace at ``at``."""
    space = _SPACE.match(text, at)
    assert space is not None  # it matches the empty string
    return space.end()
