"""What a region's URL must be: where forwards go, as ``{url}/v1/place``.

Checked where a region registers (422 naming ``url``) and again before each
forward, for a URL stored before the check was this strict: httpx took one
without a scheme or host as a request sent and unanswered (the key kept in a
region nothing was ever sent to), and raised out of routing (a 500) on one
with a tab, a bad port or a host that is no IDNA name (``xn--a``).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import httpx

USAGE = "the region's URL must be http(s)://host[:port][/path]"


def problem(url: str) -> str | None:
    """Why ``url`` cannot take forwards, or None when it can."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return f"{USAGE}, without whitespace or control characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number up to 65535
    except ValueError as exc:
        return f"{USAGE} ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return USAGE
    if "@" in parts.netloc:
        # The forward's credentials are forward_token, sent as a bearer token; a user and
        # password in the URL would be sent as well, and shown wherever the URL is.
        return f"{USAGE}, without credentials (send them as forward_token)"
    if "?" in url or "#" in url:
        # ``/v1/place`` is appended to the URL: after a query or fragment it is no path.
        return f"{USAGE}, without a query or fragment"
    try:
        # The host read as httpx reads it to connect: a label such as "xn--a" parses, but
        # is no IDNA name, and raised out of the forward (a 500) rather than here.
        httpx.URL(url).host  # noqa: B018
    except (httpx.InvalidURL, ValueError) as exc:  # idna's errors are ValueErrors
        return f"{USAGE} ({exc})"
    return None
