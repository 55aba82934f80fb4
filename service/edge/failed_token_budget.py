"""At most so many refused tokens per client address; past them, no read and no hash.

A token this process has not verified costs a database read, and one scrypt
verification (16 MiB and about 40 ms of a core, service/tokens/secrets.py)
when its id names a real token; ids are not secret (token listings, the
audit log). The request rate (rate_limit.py) is counted per presented token,
so a client presenting a new made-up token each time was never limited by it.

So each client address also has a bucket of failures (the same token bucket
as the request rate's, :class:`RateLimiter`): checking a token not verified
yet takes one from it before anything is read, and the token check gives it
back when the token is good, when the database did not answer, or when the
process had no verification slot free (service/tokens/verification_slots.py):
what stays taken is a token refused as unknown, revoked, of a wrong secret or
of no known form. Taking first means one address cannot start more checks at
once than its bucket holds. While the bucket is empty, such a token is
answered 429 ``rate_limited`` with Retry-After before any read or hash.

Tokens the process already knows (static ones, those it verified before) are
answered before this is asked, without it: several honest clients behind one
proxy share an address, and one of them guessing does not lock out the
others' working tokens. A token refused within the last few seconds is
refused again from memory (service/auth.py), free, without taking from the
bucket: a client retrying a revoked token is not guessing.

An address is an IPv4 address, or an IPv6 address's /64 (one host commonly
holds a whole /64, and would otherwise guess on from a new address each
time); an IPv4-mapped IPv6 address is its IPv4 one. The buckets are bounded
as the request rate's are (the oldest go first).
"""

from __future__ import annotations

import ipaddress
import math
import time
from collections.abc import Callable

from service.edge.rate_limit import MAX_BUCKETS, RateLimiter
from service.errors import RateLimited

MAX_ADDRESSES = MAX_BUCKETS
# An honest address fails rarely (a mistyped or revoked token, and a retry of the same
# one is free); 20 at once covers a proxy's worth of them. 1 a second then holds one
# address to ~40 ms of scrypt a second, 4% of a core.
DEFAULT_PER_S = 1.0
DEFAULT_BURST = 20


class FailedTokenBudget:
    """Refused tokens per client address; thread-safe (REST and gRPC share one)."""

    def __init__(
        self,
        rate: float = DEFAULT_PER_S,
        burst: int = DEFAULT_BURST,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets = RateLimiter(rate, burst, clock)

    def take(self, address: str | None) -> None:
        """Take one check from ``address``'s bucket, or raise :class:`RateLimited` when it
        is empty."""
        if self.rate <= 0:
            return
        wait = self._buckets.take(address_key(address))
        if wait > 0:
            raise RateLimited(
                f"too many refused tokens from this address ({self.burst} at once, then"
                f" {self.rate:g} a second: TOPOPLACE_AUTH_FAILURE_BURST,"
                " TOPOPLACE_AUTH_FAILURES_PER_S); a token this service verified before is"
                " still accepted from it",
                retry_after=max(1, math.ceil(wait)),
                detail={"failures_per_s": self.rate, "burst": self.burst},
            )

    def give_back(self, address: str | None) -> None:
        """Return the check taken for a token that turned out not to be a failure."""
        if self.rate > 0:
            self._buckets.give_back(address_key(address))

    def tracked(self) -> int:
        return self._buckets.tracked()


def address_key(address: str | None) -> bytes:
    """The bucket an address counts against (see the module's docstring)."""
    if not address:
        return b"-"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return b"n" + address.encode()  # a name (a Unix socket's path, a test client)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return b"4" + ip.ipv4_mapped.packed
        return b"6" + ip.packed[:8]
    return b"4" + ip.packed
