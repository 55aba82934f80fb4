"""argparse value types shared by ``topoplace`` and ``topoplace agent``.

Each raises ``argparse.ArgumentTypeError`` with a message saying what was
wrong, so argparse reports ``--flag: <message>`` and exits 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def int_at_least(minimum: int) -> Callable[[str], int]:
    """A whole number no smaller than ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """A duration in seconds, more than zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value
