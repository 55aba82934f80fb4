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
# ASCII digits (``\d`` took "\u0661" for 1), at most 20 of them (any 64-bit number):
# int() refuses more than 4,300 with a ValueError that is no HostlistError.
_RANGE = re.compile(r"^([0-9]{1,20})(?:-([0-9]{1,20}))?$")


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
            raise HostlistError(
                f"{piece[:40]!r} is not a number (of at most 20 digits) or a range in host"
                f" list {item[:80]!r}"
            )
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"range {piece!r} goes backwards in host list {item!r}")
        ranges.append((low, int(low), int(high)))
    return ranges


Ranges = list[tuple[str, int, int]]


def _parts(item: str) -> tuple[list[str], list[Ranges]]:
    """One item's text between brackets (one more than brackets) and each bracket's
    ranges, read in a loop: read a bracket a call deeper, 2,000 brackets (8 KB) passed
    the recursion limit."""
    texts: list[str] = []
    brackets: list[Ranges] = []
    rest = item
    while (start := rest.find("[")) >= 0:
        end = rest.index("]", start)
        texts.append(rest[:start])
        brackets.append(_ranges(rest[start + 1 : end], item))
        rest = rest[end + 1 :]
    texts.append(rest)
    return texts, brackets


def _count(item: str) -> int:
    """How many names one item makes, counted without making them."""
    count = 1
    for ranges in _parts(item)[1]:
        count *= sum(high - low + 1 for _, low, high in ranges)
    return count


def _numbers(ranges: Ranges) -> Iterator[str]:
    """A bracket's numbers as written in names (node[01-10] keeps the zero padding)."""
    for written, low, high in ranges:
        for number in range(low, high + 1):
            yield f"{number:0{len(written)}d}"


def _names(item: str) -> Iterator[str]:
    """The names of one item, in order (the first bracket's numbers outermost), each made
    only when it is read: one iterator per bracket on a stack, not a call per bracket."""
    texts, brackets = _parts(item)
    if not brackets:
        yield item
        return
    stack = [_numbers(brackets[0])]
    chosen: list[str] = []  # a number of each bracket but the last one's on the stack
    while stack:
        number = next(stack[-1], None)
        if number is None:  # this bracket is done: the one before it takes its next
            stack.pop()
            if chosen:
                chosen.pop()
        elif len(stack) < len(brackets):
            chosen.append(number)
            stack.append(_numbers(brackets[len(stack)]))
        else:
            numbers = [*chosen, number]
            yield "".join(t + n for t, n in zip(texts, numbers, strict=False)) + texts[-1]


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
