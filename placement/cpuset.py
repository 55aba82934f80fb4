"""Linux cpuset strings ("0-19,40-59") to sorted CPU lists and back."""

from __future__ import annotations

import re
from collections.abc import Iterable

# ASCII digits only: int() also reads "9_9999" and other scripts' digits, which no
# kernel writes and which slipped past a check for CPU ids made of \d+ runs.
_ITEM = re.compile(r"([0-9]+)\s*(?:-\s*([0-9]+))?")


class CpusetError(ValueError):
    """A cpuset string that Linux would not accept."""


def parse_cpuset(text: str) -> tuple[int, ...]:
    """Parse ``"0-3,8,10-11"`` into ``(0, 1, 2, 3, 8, 10, 11)``; empty text is no CPUs."""
    return tuple(cpu for lo, hi in cpuset_spans(text) for cpu in range(lo, hi + 1))


def cpuset_spans(text: str) -> tuple[tuple[int, int], ...]:
    """Parse ``"8,0-3,2-5"`` into its ranges, sorted and merged: ``((0, 5), (8, 8))``.

    Costs the number of items, not of CPUs: a cpuset's size can be counted, and two
    compared, before anything expands ``"0-2000000000"``.
    """
    body = text.strip()
    if not body:
        return ()
    spans: list[tuple[int, int]] = []
    for part in body.split(","):
        item = part.strip()
        if not item:
            raise CpusetError(f"empty item in cpuset {text!r}")
        found = _ITEM.fullmatch(item)
        if found is None:
            raise CpusetError(f"{item!r} in cpuset {text!r} is not a CPU number or range")
        lo = int(found[1])
        hi = int(found[2]) if found[2] is not None else lo
        if hi < lo:
            raise CpusetError(f"range {item!r} in cpuset {text!r} is empty or negative")
        spans.append((lo, hi))
    spans.sort()
    merged = [spans[0]]
    for lo, hi in spans[1:]:
        last_lo, last_hi = merged[-1]
        if lo <= last_hi + 1:
            merged[-1] = (last_lo, max(last_hi, hi))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def format_cpuset(cpus: Iterable[int]) -> str:
    """Compress CPU numbers into Linux cpuset syntax, ranges merged."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)
