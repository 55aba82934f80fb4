"""Kubernetes quantities read exactly: thousandths of the unit, rounded up as Kubernetes
stores them, and memory rounded up to whole MiB."""

from __future__ import annotations

import pytest

from service.k8s.quantity import CAP, BadQuantity, mib, milli_units

MIB = 2**20


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        ("500m", 500),
        ("2", 2000),
        ("1.5", 1500),
        (".5", 500),
        ("5.", 5000),
        ("+1", 1000),
        ("0", 0),
        ("-0", 0),
        ("0.1m", 1),  # Kubernetes rounds up to 1m
        ("1.0001", 1001),  # a fraction of a milli-unit rounds up
        ("1." + "0" * 5000 + "1", 1001),  # exact at any length
        ("0." + "0" * 5000 + "1", 1),
        ("1e-999999", 1),
        ("4Gi", 4 * 2**30 * 1000),
        ("512Mi", 512 * MIB * 1000),
        ("1.5Ki", 1536 * 1000),
        ("1G", 10**12),
        ("2k", 2 * 10**6),
        ("128974848", 128974848 * 1000),
        ("129e6", 129 * 10**9),
        ("1E3", 10**6),  # an exponent ...
        ("12e-3", 12),
        ("1E", CAP),  # ... but E alone is exa, and 10**21 milli-units are past the cap
        ("8Ei", CAP),
        ("9" * 5000, CAP),
        ("1e2147483647", CAP),
        (3, 3000),  # an unquoted JSON number, as Kubernetes' decoder takes
        (0.25, 250),
    ],
)
def test_quantities_are_read_exactly(text: object, milli: int) -> None:
    assert milli_units(text) == milli


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "not a quantity"),
        ("abc", "not a quantity"),
        (".", "not a quantity"),
        ("-1", "negative"),
        ("-500m", "negative"),
        ("1e", "unknown suffix"),  # an exponent needs digits
        ("1KI", "unknown suffix"),
        ("1ki", "unknown suffix"),
        ("1 ", "unknown suffix"),
        (" 1", "not a quantity"),
        ("1_000", "unknown suffix"),
        ("\u0662", "not a quantity"),  # a digit, but not an ASCII one
        ("1e2147483648", "32 bits"),
        ("1e" + "9" * 5000, "32 bits"),
        (float("nan"), "not a quantity"),
        (float("inf"), "not a quantity"),
        (True, "not a quantity"),
        (None, "not a quantity"),
        ([1], "not a quantity"),
    ],
)
def test_what_is_not_a_quantity_is_refused(text: object, words: str) -> None:
    with pytest.raises(BadQuantity, match=words):
        milli_units(text)


@pytest.mark.parametrize(
    ("text", "whole_mib"),
    [("512Mi", 512), ("4Gi", 4096), ("1G", 954), ("128974848", 123), ("129e6", 124), ("1", 1)],
)
def test_memory_rounds_up_to_whole_mib(text: str, whole_mib: int) -> None:
    assert mib(milli_units(text)) == whole_mib
    assert mib(0) == 0
