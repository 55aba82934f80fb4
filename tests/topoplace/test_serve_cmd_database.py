"""`topoplace serve` and `db upgrade` against a database that does not answer."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from topoplace import cli


@pytest.fixture
def silent_database() -> Iterator[int]:
    """A port that accepts connections and never says a word: a frozen server, a
    half-open proxy, a failover's old address."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("command", [["serve", "--no-grpc"], ["db", "upgrade"]])
def test_a_database_that_never_answers_ends_the_command_with_one_line(
    command: list[str],
    silent_database: int,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without a connect timeout libpq waits for good: serve sat silent at start.
    url = f"postgresql+psycopg://topoplace:s3cret@127.0.0.1:{silent_database}/db?connect_timeout=2"
    monkeypatch.setenv("TOPOPLACE_DATABASE_URL", url)
    monkeypatch.setenv("TOPOPLACE_PORT", str(_closed_port()))
    started = time.monotonic()
    assert cli.main(command) == 1
    assert time.monotonic() - started < 20
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "did not answer: connection timeout expired" in err
    assert f"127.0.0.1:{silent_database}/db" in err and "s3cret" not in err


def test_a_refused_connection_names_the_database_and_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    port = _closed_port()
    monkeypatch.setenv("TOPOPLACE_DATABASE_URL", f"postgresql+psycopg://u@127.0.0.1:{port}/db")
    assert cli.main(["db", "upgrade"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Connection refused" in err
    assert "check TOPOPLACE_DATABASE_URL" in err
