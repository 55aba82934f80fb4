"""argparse value types shared by ``topoplace`` and ``topoplace agent``.

Each raises ``argparse.ArgumentTypeError`` with a message saying what was
wrong, so argparse reports ``--flag: <message>`` and exits 2.
"""

from __future__ import annotations

import argparse
import math
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


def finite_number(text: str) -> float:
    """A finite number; its range is the service's to check. ``nan`` and ``inf`` are not
    JSON: the request body could not even be written."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_seconds(text: str) -> float:
    """A duration in seconds, more than zero and finite: an ``inf`` wait never ends."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    if math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds, got {text}")
    return value


def seconds_up_to(maximum: float) -> Callable[[str], float]:
    """A duration in seconds, more than zero and no more than ``maximum``."""

    def parse(text: str) -> float:
        value = positive_seconds(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g} seconds, got {text}")
        return value

    return parse
