"""The nesting depth of a JSON body, measured on its raw bytes before any parser reads it.

The standard library's parser (FastAPI's) recurses once per level, so a body
of 100,000 ``[`` ends in a RecursionError; a body a little shallower than
that passes and recurses again in every validator. No request of this API
nests more than about 20 levels (a Kubernetes pod with its managed fields);
:data:`MAX_DEPTH` leaves room.

The check costs next to nothing for the usual small body: one with fewer
brackets than the limit cannot nest deeper.
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
