"""The client's address in grpc's peer string, as REST's ASGI ``client`` names it.

grpc names a peer ``ipv4:10.0.0.1:50123``, ``ipv6:[2001:db8::1]:50123`` or
``unix:/path``: the failed-token budget (service/edge/failed_token_budget.py)
counts against the host part, so a client is one address over REST and gRPC.
"""

from __future__ import annotations

from urllib.parse import unquote


def peer_host(peer: str | None) -> str | None:
    """``10.0.0.1``, ``2001:db8::1``, the socket's path; None when there is no peer."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or rest
    if kind == "ipv6":
        host = rest.rpartition(":")[0] or rest
        # A zone is percent-encoded ("[fe80::1%25eth0]"); the budget ignores it anyway.
        return unquote(host.removeprefix("[").removesuffix("]"))
    return rest or kind
