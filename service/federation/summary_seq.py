"""How far ahead a region's summary seq may be: never so far that no later push passes it.

A summary's seq is the region's wall clock in nanoseconds, or one above the stored
seq a replay refusal named (service/federation/pusher.py); the global service
keeps a summary only when its seq is above the stored one. Seqs are stored as a
BIGINT, so 2^63-1 (a clock in the year 2262) is the largest there can be: a region
that once pushed it (a clock set centuries ahead, a bug) could never push again,
as no seq above it can be sent or stored, and a region's name is never given
again. So a seq more than a day ahead of the global service's own clock is
refused (422 ``seq_ahead``), nothing stored: a region recovers by setting its
clock right, its next push then taken. A stored seq more than two days ahead of
the clock binds no push either: it was stored before this check (or under a
global clock set back since by more than a day), and would otherwise lock the
region out. A seq this service accepted is at most a day ahead of its clock then,
so it binds every replica whose clock is less than a day behind.

The clock is this machine's wall clock (``time.time_ns``), the one the region's
seq is read from on its side, rather than the service's injectable clock.
"""

from __future__ import annotations

from service.errors import SeqAhead

SEQ_MAX = 2**63 - 1  # the largest a stored seq (BIGINT) can be
AHEAD_S = 86_400
AHEAD_NS = AHEAD_S * 10**9


def check(seq: int, now_ns: int) -> None:
    """Refuse a seq more than a day ahead of ``now_ns`` (SeqAhead)."""
    if seq <= now_ns + AHEAD_NS:
        return
    raise SeqAhead(
        f"seq {seq} is more than {AHEAD_S} s ahead of the global service's clock ({now_ns}):"
        " a summary's seq is the region's clock in nanoseconds, and one this far ahead would"
        f" leave no room below the largest seq, 2^63-1 ({SEQ_MAX}), for the pushes after it."
        " Nothing was stored; set the region's clock right and push again",
        {"field": "summary.seq", "seq": seq, "max_seq": SEQ_MAX, "ahead_limit_s": AHEAD_S},
    )


def binding_up_to(now_ns: int) -> int:
    """The largest stored seq that binds a push at ``now_ns``: one above it is forgotten."""
    return now_ns + 2 * AHEAD_NS
