"""What a region's forward token must be: it is sent as ``Authorization: Bearer <token>``.

A header carries bytes, and a bearer token is visible ASCII with no space in it
(RFC 6750's b64token is narrower still; a topoplace token is ``tpp_`` and
URL-safe base64). A token past that was registered, and every forward to its
region then raised out of routing (httpx encodes a header value as ASCII): a 500
for each job that ranked the region first. Checked where a token is set (422
naming ``forward_token``) and again before each forward, for one stored before
the check: that forward is not sent, as for a region not reached.
"""

from __future__ import annotations

import re

PATTERN = "^[!-~]+$"
_BEARER = re.compile(PATTERN)
USAGE = "the forward_token must be visible ASCII without spaces (a bearer token)"


def problem(token: str) -> str | None:
    """Why ``token`` cannot be sent as a bearer token, or None when it can."""
    return None if _BEARER.fullmatch(token) else USAGE
