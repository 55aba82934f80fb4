"""The gate that keeps a storm of refused placements from writing a row each."""

from __future__ import annotations

from service.audit.refusals import RefusalGate


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_one_row_per_shape_a_window_with_the_others_counted() -> None:
    ticks = Ticks()
    gate = RefusalGate(60.0, 100, clock=ticks)
    assert gate.admit("a") == 0
    assert [gate.admit("a") for _ in range(5)] == [None] * 5
    assert gate.admit("b") == 0  # another shape is not held back by the first
    ticks.now += 59.9
    assert gate.admit("a") is None
    ticks.now += 0.1
    assert gate.admit("a") == 6  # the window passed: the six coalesced ride on this row
    assert gate.admit("a") is None


def test_all_shapes_together_are_capped_a_window() -> None:
    ticks = Ticks()
    gate = RefusalGate(60.0, 3, clock=ticks)
    assert [gate.admit(n) for n in range(5)] == [0, 0, 0, None, None]
    ticks.now += 60.0
    assert gate.admit(3) == 1  # turned away by the cap, counted, written in the next window
    assert gate.admit(0) == 0


def test_window_zero_writes_every_refusal() -> None:
    gate = RefusalGate(0.0, 10, clock=Ticks())
    assert [gate.admit("a") for _ in range(3)] == [0, 0, 0]


def test_remembered_shapes_are_bounded() -> None:
    gate = RefusalGate(60.0, 10_000, max_shapes=4, clock=Ticks())
    for n in range(10):
        gate.admit(n)
    assert len(gate._shapes) == 4
    assert gate.admit(0) == 0  # forgotten, so it is written again
