"""Slurm host lists: ``node[1-3,7],gpu-a01`` <-> names.

Slurm passes node lists in this compressed form (``req_nodes``, a
partition's ``nodes``); job_submit.lua cannot expand them, so the service does.
"""

from __future__ import annotations

import re

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


def _expand_one(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, rest = item[:start], item[start + 1 : end], item[end + 1 :]
    tails = _expand_one(rest) if rest else [""]
    names: list[str] = []
    for piece in body.split(","):
        match = _RANGE.match(piece.strip())
        if match is None:
            raise HostlistError(f"{piece!r} is not a number or a range in host list {item!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise HostlistError(f"range {piece!r} goes backwards in host list {item!r}")
        width = len(low)  # node[01-10] keeps the zero padding
        for number in range(int(low), int(high) + 1):
            names += [f"{prefix}{number:0{width}d}{tail}" for tail in tails]
    return names


def expand(text: str | None) -> list[str]:
    """Every name of a host list, in order, without duplicates; ``None`` or ``""``: none."""
    if not text:
        return []
    seen: dict[str, None] = {}
    for item in _split_top(text):
        for name in _expand_one(item):
            seen.setdefault(name, None)
    return list(seen)
