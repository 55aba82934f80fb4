"""Which ``Host`` an ``--insecure-dev`` service answers a call without a token for.

With ``--insecure-dev`` a call without a token is an admin's. A page of another
site that the developer's browser opens can point a name of its own at
127.0.0.1 (DNS rebinding): the browser then treats the service as that site's
own origin, sends its calls as same-origin (no ``Sec-Fetch-Site: cross-site``
to refuse) and lets the page read the answers. What the browser cannot change
is the ``Host`` header: it names the page's site. So a call without a token is
answered only for a loopback host (``localhost``, a ``*.localhost`` name,
127.0.0.0/8, ``::1``) or a name the operator lists (``TOPOPLACE_INSECURE_DEV_HOSTS``:
the laptop's own name, a container's service name). A request with no ``Host``
at all comes from a program (HTTP/1.0), never from a browser.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable


def host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port, lower case: ``[::1]:8000`` is
    ``::1``, ``Example.org:80`` is ``example.org``."""
    value = header.strip().lower()
    if value.startswith("["):  # an IPv6 literal, its port after the bracket
        return value[1 : value.find("]")] if "]" in value else value[1:]
    name, _, _ = value.partition(":")
    return name.rstrip(".")  # 'localhost.' is 'localhost'


def is_loopback(name: str) -> bool:
    """A name or address that can only mean this machine."""
    if name == "localhost" or name.endswith(".localhost"):  # RFC 6761: never the network
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class DevHosts:
    """The hosts an --insecure-dev service answers tokenless calls for."""

    def __init__(self, listed: Iterable[str] = ()) -> None:
        self.listed = frozenset(host_name(h) for h in listed if h.strip())

    def allows(self, header: str | None) -> bool:
        if header is None:
            return True  # no Host: a program's HTTP/1.0 call, which no browser sends
        name = host_name(header)
        return is_loopback(name) or name in self.listed
