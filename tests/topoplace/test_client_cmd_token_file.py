"""--token-file: a file that gives no token stops every client command before it calls."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from topoplace import client_cmd
from topoplace.cli import main

# Nothing listens on the discard port: a command that got past its token would exit 3.
NOWHERE = "http://127.0.0.1:9"


@pytest.mark.parametrize("content", [b"", b"\n", b"   \t\nsecond-line-token\n"])
@pytest.mark.parametrize("command", [["nodes"], ["token", "list"], ["slurm", "show", "7"]])
def test_an_empty_token_file_is_a_usage_error(
    tmp_path: Path, content: bytes, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: an empty or blank first line was taken for 'no token' and the command went on
    unauthenticated."""
    token_file = tmp_path / "token"
    token_file.write_bytes(content)
    code = main([*command, "--server", NOWHERE, "--token-file", str(token_file)])
    err = capsys.readouterr().err
    assert code == client_cmd.EXIT_USAGE, err
    assert err == f"error: --token-file: {token_file} holds no token on its first line\n"


@pytest.mark.parametrize(
    ("make", "why"),
    [
        (lambda path: None, "No such file or directory"),
        (lambda path: path.mkdir(), "Is a directory"),
        (lambda path: path.write_bytes(b"\xff\xfe token\n"), "not UTF-8 text"),
    ],
)
def test_an_unreadable_token_file_is_a_usage_error(
    tmp_path: Path, make: Callable[[Path], object], why: str, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file = tmp_path / "token"
    make(token_file)
    code = main(["nodes", "--server", NOWHERE, "--token-file", str(token_file)])
    err = capsys.readouterr().err
    assert code == client_cmd.EXIT_USAGE, err
    assert err == f"error: --token-file: cannot read {token_file}: {why}\n"
