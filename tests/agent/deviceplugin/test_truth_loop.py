"""The truth loop outlives a round that fails in a way nothing in it expected."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from agent.deviceplugin.state import Claims
from agent.deviceplugin.truth import TruthLoop
from tests.waiting import wait_until


def test_a_round_that_raises_is_logged_and_the_next_one_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    def resources() -> set[str]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("an answer nothing expected")
        return {"nvidia.com/gpu"}

    loop = TruthLoop(
        str(tmp_path / "none.sock"), resources, Claims(), list, lambda *_: None, 0.01, 0.2
    )
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    with caplog.at_level(logging.WARNING, logger="topoplace.deviceplugin"):
        thread.start()
        try:
            # Was: the thread ended with the first round's exception; no second round.
            wait_until(lambda: len(calls) >= 3, "rounds after the failed one")
        finally:
            stop.set()
            loop.wake.set()
            thread.join(5)
    failed = [r for r in caplog.records if r.exc_info is not None]
    assert failed and "the truth round failed" in failed[0].getMessage()
    assert "an answer nothing expected" in caplog.text
