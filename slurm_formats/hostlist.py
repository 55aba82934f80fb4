"""Slurm host lists: ``node[1-3,7],gpu-a01`` <-> names.

Slurm passes node lists in this compressed form (``req_nodes``, a
partition's ``nodes``); job_submit.lua cannot expand them, so the service does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

# Far more nodes than any cluster has: a list naming more is refused before it is
# expanded, so that one short text (``n[0-99999999999]``) cannot take the memory and
# the time of the process reading it.
MAX_NAMES = 65_536
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    """A host list Slurm would not accept either."""


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in host list {text!r}")
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in host list {text!r}")
    parts.append("".join(current))
    return [p.strip() for p in parts if p.strip()]


def _too_many(text: str) -> HostlistError:
    return HostlistError(f"host list {text[:80]!r} names more than {MAX_NAMES} nodes")


def _ranges(body: str, item: str) -> list[tuple[str, int, int]]:
    """The bracket's ranges as (first as written, first, last)."""
    ranges: list[tuple[str, int, int]] = []
    for piece in body.split(","):
        match = _RANGE.match(piece.strip())
        if match is None:
            raise HostlistError(f"{piece!r} is not a number or a range in host list {item!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"range {piece!r} goes backwards in host list {item!r}")
        ranges.append((low, int(low), int(high)))
    return ranges


def _count(item: str) -> int:
    """How many names one item makes, counted without making them."""
    start = item.find("[")
    if start < 0:
        return 1
    end = item.index("]", start)
    ranges = _ranges(item[start + 1 : end], item)
    rest = item[end + 1 :]
    return sum(high - low + 1 for _, low, high in ranges) * (_count(rest) if rest else 1)


def _names(item: str) -> Iterator[str]:
    """The names of one item, in order, each made only when it is read."""
    start = item.find("[")
    if start < 0:
        yield item
        return
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    for written, low, high in _ranges(body, item):
        width = len(written)  # node[01-10] keeps the zero padding
        for number in range(low, high + 1):
            head = f"{prefix}{number:0{width}d}"
            if rest:
                yield from (head + tail for tail in _names(rest))
            else:
                yield head


def expand(text: str | None, limit: int | None = None) -> list[str]:
    """Every name of a host list, in order, without duplicates; ``None`` or ``""``: none.
    A list of more than ``MAX_NAMES`` names is refused (HostlistError) unexpanded.
    ``limit``: only the first that many names are made (a caller that pairs the names
    with a shorter list of its own), the whole list checked all the same."""
    if not text:
        return []
    items = _split_top(text)
    made = 0
    for item in items:
        made += _count(item)
        if made > MAX_NAMES:
            raise _too_many(text if len(items) > 1 else item)
    seen: dict[str, None] = {}
    if limit is not None and limit <= 0:
        return []
    for name in (name for item in items for name in _names(item)):
        seen.setdefault(name, None)
        if limit is not None and len(seen) >= limit:
            break
    return list(seen)
