"""Slurm host lists: ``node[1-3,7],gpu-a01`` <-> names.

Slurm passes node lists in this compressed form (``req_nodes``, a
partition's ``nodes``); job_submit.lua cannot expand them, so the service does.
"""

from __future__ import annotations

import re

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


def _expand_one(item: str, budget: int) -> list[str]:
    """The names of one item; more than ``budget`` of them is refused, counted first."""
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    ranges = _ranges(body, item)
    count = sum(high - low + 1 for _, low, high in ranges)
    if count > budget:
        raise _too_many(item)
    tails = _expand_one(rest, budget // count) if rest else [""]
    names: list[str] = []
    for written, low, high in ranges:
        width = len(written)  # node[01-10] keeps the zero padding
        for number in range(low, high + 1):
            names += [f"{prefix}{number:0{width}d}{tail}" for tail in tails]
    return names


def expand(text: str | None) -> list[str]:
    """Every name of a host list, in order, without duplicates; ``None`` or ``""``: none.
    A list of more than ``MAX_NAMES`` names is refused (HostlistError) unexpanded."""
    if not text:
        return []
    seen: dict[str, None] = {}
    made = 0
    for item in _split_top(text):
        names = _expand_one(item, MAX_NAMES - made)
        made += len(names)
        if made > MAX_NAMES:  # plain names, one per item
            raise _too_many(text)
        for name in names:
            seen.setdefault(name, None)
    return list(seen)
