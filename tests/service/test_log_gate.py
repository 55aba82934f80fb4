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


def test_a_key_inside_its_window_stays_held_back_among_many_keys() -> None:
    # A cluster with many distinct differences: each is still logged once per window.
    now = [0.0]
    gate = LogGate(every_s=600.0, clock=lambda: now[0])
    keys = [("node", i) for i in range(150)]
    assert [gate.due(k) for k in keys] == [0] * len(keys)
    now[0] += 599.0
    assert [gate.due(k) for k in keys] == [None] * len(keys)
    now[0] += 1.0
    assert [gate.due(k) for k in keys] == [1] * len(keys)


def test_the_keys_remembered_are_bounded_and_the_expired_go_first() -> None:
    now = [0.0]
    gate = LogGate(clock=lambda: now[0])
    half = MAX_KEYS // 2
    for i in range(half):
        assert gate.due(("old", i)) == 0
    now[0] += LOG_EVERY_S
    for i in range(MAX_KEYS - half):
        assert gate.due(("new", i)) == 0
    assert gate.due("one more") == 0  # room made by the expired, not the new refused
    assert len(gate._last) <= MAX_KEYS
    assert all(gate.due(("new", i)) is None for i in range(MAX_KEYS - half))


def test_past_the_bound_inside_their_windows_only_the_oldest_is_forgotten() -> None:
    gate = LogGate(clock=lambda: 0.0)
    for i in range(MAX_KEYS):
        assert gate.due(i) == 0
    assert gate.due(MAX_KEYS) == 0  # the new is let through and remembered
    assert len(gate._last) == MAX_KEYS
    assert all(gate.due(i) is None for i in range(1, MAX_KEYS + 1))
    assert gate.due(0) == 0  # the oldest, forgotten for its room: one line early
    assert len(gate._last) == MAX_KEYS
