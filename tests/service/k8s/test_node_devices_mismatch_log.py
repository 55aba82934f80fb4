"""A difference reported again every round: logged and kept once, then once a while."""

from __future__ import annotations

import logging

import pytest

from service.k8s import node_devices
from service.k8s.device_schemas import PodDevices, PodOutcome


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _unmatched(store: node_devices.MismatchLog, pod: str, devices: list[str]) -> None:
    outcome = PodOutcome(namespace="ns", name=pod, action="unmatched")
    node_devices._record(
        store, "h0", PodDevices(namespace="ns", name=pod, devices=devices), outcome, [], ()
    )


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "topoplace.k8s"]


def test_the_same_mismatch_is_logged_once_then_once_a_while_with_the_count(
    caplog: pytest.LogCaptureFixture,
):
    clock = Clock()
    store = node_devices.MismatchLog(log_every_s=600, clock=clock)
    caplog.set_level(logging.WARNING, logger="topoplace.k8s")
    for _ in range(30):  # five minutes of reports, 10 s apart
        _unmatched(store, "copy-0", ["GPU-a"])
        clock.now += 10
    assert len(_lines(caplog)) == 1 and "more times" not in _lines(caplog)[0]
    clock.now += 600
    _unmatched(store, "copy-0", ["GPU-a"])
    assert len(_lines(caplog)) == 2
    assert "(reported 29 more times since it was last logged)" in _lines(caplog)[1]


def test_a_changed_mismatch_is_logged_at_once(caplog: pytest.LogCaptureFixture):
    store = node_devices.MismatchLog(log_every_s=600, clock=Clock())
    caplog.set_level(logging.WARNING, logger="topoplace.k8s")
    _unmatched(store, "copy-0", ["GPU-a"])
    _unmatched(store, "copy-0", ["GPU-b"])
    _unmatched(store, "copy-1", ["GPU-a"])
    assert len(_lines(caplog)) == 3


def test_a_repeated_mismatch_does_not_push_the_others_out_of_the_store():
    store = node_devices.MismatchLog(clock=Clock())
    _unmatched(store, "other", ["GPU-b"])
    for _ in range(node_devices._RECENT + 5):
        _unmatched(store, "copy-0", ["GPU-a"])
    view = store.view()
    assert [m.pod for m in view.recent] == ["other", "copy-0"]
    assert view.counts.unmatched == 2
