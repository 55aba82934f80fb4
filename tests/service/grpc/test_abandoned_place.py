"""A Place without an Idempotency-Key whose call ended before its answer (the client's
deadline passed, or it cancelled) reserves nothing that outlives the call: its client
cannot learn the allocation, and its retry would reserve a second one."""

from __future__ import annotations

import threading
import time
from typing import Any

import grpc
import pytest

from placement.profiles import build_profile
from service.allocations import api as allocations
from service.grpc import abandoned, convert
from service.grpc.gen import topoplace_pb2 as pb
from tests.service.grpc.conftest import Running

WAIT_S = 10.0


def _node(running: Running) -> None:
    snap = build_profile("hgx-h100", "h0")
    running.stub.ReportSnapshot(
        pb.ReportSnapshotRequest(node="h0", snapshot_json=snap.model_dump_json())
    )


def _states(running: Running, job_id: str) -> list[str]:
    listed = running.stub.ListAllocations(pb.ListAllocationsRequest(job_id=job_id))
    return [a.state for a in listed.allocations]


def _settled(running: Running, job_id: str) -> list[str]:
    """The job's allocations once none is pending any more, or as they are after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    states = _states(running, job_id)
    while time.monotonic() < deadline and (not states or "pending" in states):
        time.sleep(0.05)
        states = _states(running, job_id)
    return states


def _ended(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the server has seen the call end (its handler cancelled)."""
    ended = threading.Event()
    abandon = abandoned.Handover.abandon

    def seen(self: abandoned.Handover) -> str | None:
        made = abandon(self)
        ended.set()
        return made

    monkeypatch.setattr(abandoned.Handover, "abandon", seen)
    return ended


def _held(monkeypatch: pytest.MonkeyPatch, after: bool = False) -> threading.Event:
    """``allocations.place`` made to wait until the returned event is set: before it
    decides, or ``after`` its commit."""
    finish = threading.Event()
    place = allocations.place

    def held(*args: Any, **kwargs: Any) -> Any:
        if not after:
            finish.wait(WAIT_S)
        placed = place(*args, **kwargs)
        if after:
            finish.wait(WAIT_S)
        return placed

    monkeypatch.setattr(allocations, "place", held)
    return finish


def test_a_place_past_its_deadline_before_the_decision_keeps_nothing(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    _node(running)
    finish, ended = _held(monkeypatch), _ended(monkeypatch)
    with pytest.raises(grpc.RpcError) as cut:
        running.stub.Place(pb.PlaceRequest(gpus=2, job_id="cut"), timeout=0.5)
    assert cut.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert ended.wait(WAIT_S)
    finish.set()  # the decision and its commit now run, for a call already over
    assert _settled(running, "cut") == ["released"]
    assert len(running.stub.GetNode(pb.GetNodeRequest(name="h0")).free_gpus) == 8


def test_a_place_cancelled_after_its_commit_keeps_nothing(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    _node(running)
    finish, ended = _held(monkeypatch, after=True), _ended(monkeypatch)
    future = running.stub.Place.future(pb.PlaceRequest(gpus=2, job_id="gone"))
    deadline = time.monotonic() + WAIT_S
    while _states(running, "gone") != ["pending"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _states(running, "gone") == ["pending"]
    future.cancel()
    assert ended.wait(WAIT_S)
    finish.set()
    assert _settled(running, "gone") == ["released"]


def test_a_place_cancelled_while_its_answer_is_built_keeps_nothing(
    running: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker is done with the reservation and the handler is cancelled after."""
    _node(running)
    building, finish, ended = threading.Event(), threading.Event(), _ended(monkeypatch)
    build = convert.allocation

    def held(value: Any) -> Any:
        if value.job_id == "late":  # the Place's answer, not the listing's
            building.set()
            finish.wait(WAIT_S)
        return build(value)

    monkeypatch.setattr(convert, "allocation", held)
    future = running.stub.Place.future(pb.PlaceRequest(gpus=2, job_id="late"))
    assert building.wait(WAIT_S)
    future.cancel()
    assert ended.wait(WAIT_S)
    finish.set()
    assert _settled(running, "late") == ["released"]


def test_an_answered_place_is_kept(running: Running) -> None:
    _node(running)
    placed = running.stub.Place(pb.PlaceRequest(gpus=2, job_id="kept"), timeout=10)
    assert placed.state == "pending"
    assert _states(running, "kept") == ["pending"]
