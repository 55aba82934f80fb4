"""Whether a request's ``Origin`` is the service's own, for ``--insecure-dev``.

With ``--insecure-dev`` a call without a token is an admin's, so a page of
another site must not be able to write with one. ``Sec-Fetch-Site`` says so
where the browser sends it (service/auth.py); one that does not (an older or
an embedded browser) still sends ``Origin`` with a form post or a fetch that
changes something. A page's origin is its scheme, host and port: the
service's own pages (/console, /docs) send the origin the ``Host`` header
names, and anything else, ``null`` (a sandboxed frame, a ``file:`` page)
included, is another site's page. Programs (curl, scripts) send no
``Origin``; they are not judged here.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from service.edge.dev_hosts import host_name

DEFAULT_PORTS = {"http": 80, "https": 443}


def _port_of_host(header: str) -> int | None:
    """The port a ``Host`` header names; None when it names none."""
    value = header.strip()
    if value.startswith("["):  # an IPv6 literal: the port follows the bracket
        _, _, rest = value.partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        _, _, port = value.partition(":")
    # ASCII digits only: str.isdigit() also takes '²' (a Host byte 0xB2 read as latin-1),
    # which int() then raised on: a 500 for any tokenless write naming an Origin.
    return int(port) if port.isascii() and port.isdigit() else None


def is_own_origin(origin: str, host: str | None, scheme: str) -> bool:
    """Whether ``origin`` is the origin of the service as this request reached it: its
    ``host`` header and its ``scheme`` (``http`` or ``https``)."""
    if host is None:  # no Host to compare with: not a browser's page of this service
        return False
    parts = urlsplit(origin.strip())
    if parts.scheme.lower() != scheme or parts.hostname is None or parts.path:
        return False
    try:
        origin_port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:  # a port that is no number
        return False
    host_port = _port_of_host(host) or DEFAULT_PORTS.get(scheme)
    return parts.hostname.rstrip(".") == host_name(host) and origin_port == host_port
