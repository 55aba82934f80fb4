"""Reading a Retry-After header (RFC 9110 section 10.2.3): whole seconds or an HTTP-date."""

from __future__ import annotations

from datetime import UTC
from email.utils import parsedate_to_datetime

# The longest a Retry-After holds a caller back (the node agent, the Slurm epilog): a
# misconfigured or hostile answer (a day, a year) must not keep a node silent, and so
# stale, for that long.
RETRY_AFTER_MAX_S = 300.0


def retry_after_s(value: str | None, now: float) -> float | None:
    """The seconds ``value`` asks to wait from ``now`` (Unix time), at most
    ``RETRY_AFTER_MAX_S``; a date already past is 0; None when there is no value or it
    is neither form (a negative or fractional number included)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():
        # Capped before the conversion: a thousand digits must not overflow a float.
        return float(min(int(value), int(RETRY_AFTER_MAX_S)))
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is always GMT
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - now), RETRY_AFTER_MAX_S)
