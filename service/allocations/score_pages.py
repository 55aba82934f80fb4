"""/score answers bounded: at most ``max_score_nodes`` nodes each, paged with limit/offset.

A request naming 4 MB of node names was answered with 43 MB. Now an answer
that would list more than TOPOPLACE_MAX_SCORE_NODES nodes is refused (422
``invalid_request`` on ``limit``, saying how many it would list) unless the
caller pages: ``limit`` (at most the maximum) and ``offset`` select a slice
of the answer, which then says the ``total`` and the ``next_offset`` (null
on the last page). Ranks stay those of the whole answer, so a page is a
slice of one ranking, not a ranking of its own.

An answer within the bound, asked without ``limit``, is the usual one,
encoded on the fast path (scoring.score_json). gRPC ``Score`` is bounded the
same way, through ``api.score_page`` (its ``limit`` and ``offset`` fields). The
Kubernetes extender and the Slurm routes score through their own paths,
which this does not touch.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from service.allocations.results import NodeScore, ScorePage
from service.errors import InvalidRequest

# The largest offset a page takes: gRPC's ``offset`` is an int32, and REST asks no more.
# Unbounded, an offset of 2**64 made the page's encoder fail (500).
MAX_OFFSET = 2**31 - 1


def listed_count(requested: Sequence[str] | None, cluster_size: int) -> int:
    """How many nodes an answer lists: one per requested name, else every node."""
    return len(requested) if requested is not None else cluster_size


def check_bound(count: int, limit: int | None, offset: int, maximum: int) -> bool:
    """Whether the answer is paged; raises when it is over the bound and not paged."""
    if limit is not None and limit > maximum:
        raise InvalidRequest(
            "limit", f"at most {maximum} nodes per answer (TOPOPLACE_MAX_SCORE_NODES)"
        )
    if limit is None and offset == 0:
        if count > maximum:
            raise InvalidRequest(
                "limit",
                f"this answer would list {count} nodes, over the limit of {maximum}"
                " (TOPOPLACE_MAX_SCORE_NODES): name fewer nodes, or page with"
                " ?limit=N&offset=M",
            )
        return False
    return True


def page(rows: Sequence[NodeScore], limit: int | None, offset: int, maximum: int) -> ScorePage:
    """The slice of ``rows`` a page asks for, with where the next one starts."""
    size = limit if limit is not None else maximum
    following = offset + size
    return ScorePage(
        tuple(rows[offset:following]),
        len(rows),
        offset,
        following if following < len(rows) else None,
    )


def page_json(rows: Sequence[NodeScore], limit: int | None, offset: int, maximum: int) -> bytes:
    return orjson.dumps(page(rows, limit, offset, maximum), option=orjson.OPT_UTC_Z)
