"""The argparse value types both command lines use."""

from __future__ import annotations

import argparse

import pytest

from topoplace_client.arguments import int_at_least, positive_seconds, seconds_up_to


def test_positive_seconds() -> None:
    assert positive_seconds("0.5") == 0.5
    assert positive_seconds("15") == 15.0
    for text, words in [
        ("0", "more than 0 seconds"),
        ("-1", "more than 0 seconds"),
        ("nan", "more than 0 seconds"),
        ("soon", "not a number of seconds"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            positive_seconds(text)


def test_int_at_least() -> None:
    at_least_one = int_at_least(1)
    assert at_least_one("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match="at least 1, got 0"):
        at_least_one("0")
    with pytest.raises(argparse.ArgumentTypeError, match="not a whole number"):
        at_least_one("2.5")


def test_a_bad_duration_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="p")
    parser.add_argument("--timeout", type=positive_seconds)
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["--timeout", "0"])
    assert exited.value.code == 2
    assert "--timeout: must be more than 0 seconds, got 0" in capsys.readouterr().err


def test_an_endless_duration_is_refused() -> None:
    """``inf`` used to pass as a duration, so an epilog asked to retry for it never ended."""
    for text in ["inf", "Infinity", "-inf"]:
        with pytest.raises(argparse.ArgumentTypeError, match="seconds, got"):
            positive_seconds(text)


def test_seconds_up_to() -> None:
    up_to_60 = seconds_up_to(60)
    assert up_to_60("60") == 60.0
    assert up_to_60("0.5") == 0.5
    for text, words in [
        ("60.5", "at most 60 seconds, got 60.5"),
        ("inf", "finite number of seconds, got inf"),
        ("nan", "more than 0 seconds"),
        ("-5", "more than 0 seconds"),
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=words):
            up_to_60(text)
