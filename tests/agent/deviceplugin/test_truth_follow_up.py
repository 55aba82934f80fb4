"""A pod the service deferred right after its admission is reported again within seconds.

The round an admission starts reads the List as the kubelet starts the pod: the
service defers a pod whose ``startTime`` it cannot see yet, or whose List was read
within that second (node_devices.py). Until it is taken, devices the kubelet gave
other than reserved look free to the service; waiting the whole
``--reconcile-interval`` for the next round left them so for that long.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from agent.deviceplugin import truth
from agent.deviceplugin.state import Claims
from agent.deviceplugin.truth import FOLLOW_UP_S, TruthLoop
from tests.waiting import wait_until

POD = ("ml-team", "web-0")


def _loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, answers: list[str]
) -> tuple[TruthLoop, list[float]]:
    """A loop whose kubelet lists one pod and whose service answers ``answers`` in turn
    (then 'matched'); the times of its reports."""
    monkeypatch.setattr(
        truth,
        "list_pod_devices",
        lambda socket, resources, timeout_s: {"nvidia.com/gpu": {POD: ["GPU-1"]}},
    )
    reported: list[float] = []

    def report(resource: str, pods: list[dict[str, Any]], listed_at: datetime) -> Any:
        reported.append(time.monotonic())
        action = answers[len(reported) - 1] if len(reported) <= len(answers) else "matched"
        return {"outcomes": [{"namespace": POD[0], "name": POD[1], "action": action}]}

    loop = TruthLoop(
        str(tmp_path / "pod-resources.sock"),
        lambda: {"nvidia.com/gpu"},
        Claims(),
        list,
        report,
        interval_s=60.0,
    )
    return loop, reported


def _running(loop: TruthLoop) -> tuple[threading.Event, threading.Thread]:
    stop = threading.Event()
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    thread.start()
    return stop, thread


def _stop(loop: TruthLoop, stop: threading.Event, thread: threading.Thread) -> None:
    stop.set()
    loop.wake.set()
    thread.join(5)


def test_a_pod_deferred_after_an_admission_is_reported_again_within_seconds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    loop, reported = _loop(monkeypatch, tmp_path, ["matched", "deferred", "deferred"])
    stop, thread = _running(loop)
    try:
        wait_until(lambda: len(reported) >= 1, "the first round")
        loop.wake.set()  # an admission
        # Was: the deferred pod waited for the next round, 60 s later.
        wait_until(lambda: len(reported) >= 4, "the rounds following the admission")
        assert reported[3] - reported[1] < 2 * FOLLOW_UP_S + 1
        time.sleep(2 * truth.QUICK_S)
        assert len(reported) == 4  # taken: back to the interval
    finally:
        _stop(loop, stop, thread)


def test_a_pod_deferred_for_good_is_not_reported_each_second(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # A finished pod the kubelet still lists is deferred at every round.
    loop, reported = _loop(monkeypatch, tmp_path, ["deferred"] * 1000)
    stop, thread = _running(loop)
    try:
        wait_until(lambda: len(reported) >= 1, "the first round")
        time.sleep(2 * truth.QUICK_S)
        assert len(reported) == 1  # no admission: the interval's rounds only
        loop.wake.set()
        wait_until(lambda: len(reported) >= 2, "the admission's round")
        time.sleep(FOLLOW_UP_S + 2 * truth.QUICK_S)
        assert len(reported) <= 2 + FOLLOW_UP_S / truth.QUICK_S + 1
        count = len(reported)
        time.sleep(2 * truth.QUICK_S)
        assert len(reported) == count  # the follow-up ended
    finally:
        _stop(loop, stop, thread)
