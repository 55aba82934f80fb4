"""A line of one key let through at most once per LOG_EVERY_S, the held back counted."""

from __future__ import annotations

from service.log_gate import LOG_EVERY_S, MAX_KEYS, LogGate


def test_a_key_is_let_through_once_a_while_and_says_how_many_were_held_back() -> None:
    now = [0.0]
    gate = LogGate(clock=lambda: now[0])
    assert gate.due("down") == 0
    assert [gate.due("down") for _ in range(5)] == [None] * 5
    assert gate.due("other words") == 0  # another key is its own
    now[0] += LOG_EVERY_S - 0.001
    assert gate.due("down") is None
    now[0] += 0.001
    assert gate.due("down") == 6
    assert gate.due("down") is None


def test_the_keys_remembered_are_bounded() -> None:
    gate = LogGate(clock=lambda: 0.0)
    for i in range(MAX_KEYS):
        assert gate.due(i) == 0
    assert gate.due(MAX_KEYS) == 0  # the oldest are forgotten, not the new refused
    assert gate.due(0) == 0
    assert len(gate._last) <= MAX_KEYS
