"""Checks on a JSON body's raw bytes, made before any parser reads it.

Two things no parser used by the service refuses on its own:

- **Nesting depth.** The standard library's parser (FastAPI's) recurses once
  per level, so a body of 100,000 ``[`` ends in a RecursionError; a body a
  little shallower than that passes and recurses again in every validator.
  No request of this API nests more than about 20 levels (a Kubernetes pod
  with its managed fields); :data:`MAX_DEPTH` leaves room.
- **NUL and lone surrogates**, written as the escapes ``\\u0000`` and
  ``\\ud800``. Both parse to strings that no database row can hold (Postgres
  refuses NUL in text, UTF-8 cannot encode a lone surrogate), including in
  the bodies the service reads without a typed model (Kubernetes pods, squeue
  output). Typed fields also refuse every other control character
  (``placement.text.Text``); here only these two, since pod specs and job
  comments carry newlines and tabs legitimately.

Both checks cost next to nothing for the usual small body: a body with fewer
brackets than the limit cannot nest deeper, and one without ``\\u`` has no
escape to check.
"""

from __future__ import annotations

import re

import numpy as np

MAX_DEPTH = 64

# A JSON string, unrolled so that long strings match in one linear pass.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = np.zeros(256, dtype=np.int64)
_STEP[list(b"[{")] = 1
_STEP[list(b"]}")] = -1
# A \uXXXX escape that is one: preceded by an even run of backslashes (``\\u0000``
# is a backslash and the text "u0000").
_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u([0-9a-fA-F]{4})")


def nesting_depth(body: bytes) -> int:
    """How deep the body's arrays and objects nest (brackets inside strings do not count)."""
    skeleton = _STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if not skeleton:
        return 0
    depth = np.cumsum(_STEP[np.frombuffer(skeleton, dtype=np.uint8)])
    return int(depth.max())


def too_deep(body: bytes, limit: int = MAX_DEPTH) -> bool:
    if body.count(b"[") + body.count(b"{") <= limit:
        return False
    return nesting_depth(body) > limit


def unstorable_escape(body: bytes) -> str | None:
    """The first escape that decodes to NUL or a lone surrogate, as written, or None."""
    if b"\\u" not in body:
        return None
    pending_high: re.Match[bytes] | None = None
    for match in _ESCAPE.finditer(body):
        code = int(match.group(1), 16)
        if pending_high is not None:
            adjacent = match.start() == pending_high.end()
            if not (adjacent and 0xDC00 <= code <= 0xDFFF):
                return _written(pending_high)
            pending_high = None
            continue
        if code == 0:
            return _written(match)
        if 0xD800 <= code <= 0xDBFF:
            pending_high = match
        elif 0xDC00 <= code <= 0xDFFF:
            return _written(match)
    return _written(pending_high) if pending_high is not None else None


def _written(match: re.Match[bytes]) -> str:
    return "\\u" + match.group(1).decode("ascii")


def body_problem(body: bytes) -> str | None:
    """Why the body is refused before parsing, or None."""
    if too_deep(body):
        return f"JSON nested deeper than {MAX_DEPTH} levels"
    escape = unstorable_escape(body)
    if escape is not None:
        what = "NUL" if escape == "\\u0000" else "a lone surrogate"
        return f"the escape {escape} ({what}) is not allowed in any string"
    return None
