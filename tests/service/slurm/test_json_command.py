"""parse_json: json.loads's answers and errors, decoded a piece at a time."""

from __future__ import annotations

import json

import pytest

from service.edge.json_scan import MAX_DEPTH
from service.slurm.json_command import TooDeep, parse_json
from tests.service.slurm.captured import CAPTURED

DOCUMENTS = [
    b'{"jobs": []}',
    b' { "a" : 1 , "jobs" : [ 1 , {"x": [2]} ] , "b": "c" } ',
    b"{}",
    b"[1, 2]",
    b'"x"',
    b'{"jobs": 1, "jobs": []}',  # the last one counts
    b'{"x": NaN, "jobs": []}',
    b'\xef\xbb\xbf{"jobs": []}',
    '{"jobs": []}'.encode("utf-16"),
    b'{"jobs": [1,]}',
    b'{"jobs": [1] x}',
    b"{not json",
    b'{"a": 1}}',
    b'{"a": [1, 2',
    b'{"a" 1}',
    b"{1: 2}",
    b"",
    b'{"jobs": [], "x": "\xff"}',
    b'{"a": ' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"}",  # 64 levels in all
]


def _outcome(decode: object, raw: bytes) -> object:
    try:
        return decode(raw)  # type: ignore[operator]
    except ValueError as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("raw", DOCUMENTS)
def test_the_answer_or_the_error_is_json_loads(raw: bytes) -> None:
    assert repr(_outcome(parse_json, raw)) == repr(_outcome(json.loads, raw))


def test_squeue_as_slurm_prints_it_is_read_whole() -> None:
    raw = CAPTURED.read_bytes()
    assert parse_json(raw) == json.loads(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"jobs": [' + b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1) + b"]}",
        b'{"a": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}",
        b'{"a": ' + b"[" * 100_000 + b"}",
        b"[" * 100_000,
    ],
)
def test_past_the_guards_depth_is_refused(raw: bytes) -> None:
    with pytest.raises(TooDeep, match=f"deeper than {MAX_DEPTH}"):
        parse_json(raw)
