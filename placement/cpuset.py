"""Linux cpuset strings ("0-19,40-59") to sorted CPU lists and back."""

from __future__ import annotations

from collections.abc import Iterable


class CpusetError(ValueError):
    """A cpuset string that Linux would not accept."""


def parse_cpuset(text: str) -> tuple[int, ...]:
    """Parse ``"0-3,8,10-11"`` into ``(0, 1, 2, 3, 8, 10, 11)``; empty text is no CPUs."""
    cpus: set[int] = set()
    body = text.strip()
    if not body:
        return ()
    for part in body.split(","):
        item = part.strip()
        if not item:
            raise CpusetError(f"empty item in cpuset {text!r}")
        lo_text, sep, hi_text = item.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise CpusetError(f"{item!r} in cpuset {text!r} is not a CPU number or range") from None
        if lo < 0 or hi < lo:
            raise CpusetError(f"range {item!r} in cpuset {text!r} is empty or negative")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


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
