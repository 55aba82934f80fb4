"""At most so many requests a second per caller: a token bucket per presented token.

The caller is the token the Authorization header presents, as the token
check reads it (service/tokens/presented.py: the scheme in any case, spaces
around the token), known by its digest (no token is kept in memory in the
clear); or the client's address when there is no header or it presents no
token. Keyed on the header as sent, each spelling of one token was a bucket
of its own. The digest is left in the scope (:data:`TOKEN_IDENTITY`) for the
token check, which looks the token up by the same digest: one hash a
request. Each bucket holds ``burst`` requests and refills at ``rate`` a
second; a request finding it empty is answered 429 ``rate_limited`` with
Retry-After (the whole seconds until a request is back), in the one error
shape, before the token check or any route runs. The probes (/healthz,
/readyz, /metrics) are never limited: a kubelet polling them must not be
told to wait.

The buckets are bounded (:data:`MAX_BUCKETS`): a flood of made-up tokens
evicts the oldest buckets instead of growing the process. REST (here) and
gRPC (service/grpc/rate_limit.py) share one limiter, so a token's rate is
its rate over both. A client presenting a new made-up token each time gets a
new bucket each time: guessing is bounded per address by
failed_token_budget.py, on the same buckets.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import RateLimited
from service.responses import error_response
from service.tokens.presented import identity as token_identity

UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
MAX_BUCKETS = 10_000
# The scope key the token's digest is left under for the token check (service/auth.py).
TOKEN_IDENTITY = "topoplace.token_identity"


class RateLimiter:
    """Token buckets by caller key; thread-safe (the gRPC server runs on its own thread)."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.clock = clock
        self._buckets: dict[bytes, tuple[float, float]] = {}  # key -> (tokens, at)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key: bytes) -> float:
        """Take one request from ``key``'s bucket: 0.0 when allowed, else the seconds until
        one is back."""
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - at) * self.rate)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate
            self._buckets[key] = (tokens, now)  # re-inserted: the newest is last
            if len(self._buckets) > MAX_BUCKETS:
                del self._buckets[next(iter(self._buckets))]
        return wait

    def give_back(self, key: bytes) -> None:
        """Put back one request taken from ``key``'s bucket (never above the burst): what
        it was taken for turned out not to count (service/edge/failed_token_budget.py)."""
        with self._lock:
            found = self._buckets.get(key)
            if found is not None:
                tokens, at = found
                self._buckets[key] = (min(float(self.burst), tokens + 1.0), at)

    def tracked(self) -> int:
        """How many callers have a bucket (not ``__len__``: an empty limiter is no less
        a limiter, and callers test ``limiter or default``)."""
        return len(self._buckets)

    def check(self, authorization: str | bytes | None, address: str | None) -> None:
        """Raise :class:`RateLimited` when this caller is over its rate."""
        self.check_key(caller_key(authorization, address))

    def check_key(self, key: bytes) -> None:
        """:meth:`check` of a key already made (:func:`key_of`)."""
        wait = self.take(key)
        if wait > 0:
            raise RateLimited(
                f"over the request rate of {self.rate:g}/s (burst {self.burst}) for this"
                " token, or this address without one (TOPOPLACE_RATE_LIMIT_PER_S)",
                retry_after=max(1, math.ceil(wait)),
                detail={"rate_per_s": self.rate, "burst": self.burst},
            )


def caller_key(authorization: str | bytes | None, address: str | None) -> bytes:
    """The bucket of whoever presents ``authorization`` from ``address``."""
    return key_of(token_identity(authorization), address)


def key_of(identity: bytes | None, address: str | None) -> bytes:
    """The bucket of the token whose digest is ``identity``; the address's without one."""
    if identity is not None:
        return b"t" + identity
    return b"a" + (address or "").encode()


class RateLimit:
    """ASGI middleware applying a :class:`RateLimiter` to every HTTP request but the probes."""

    def __init__(self, app: ASGIApp, limiter: RateLimiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and self.limiter.enabled
            and scope["path"] not in UNLIMITED_PATHS
        ):
            header = None
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    header = value
                    break
            identity = token_identity(header)
            if identity is not None:
                scope[TOKEN_IDENTITY] = identity
            client = scope.get("client")
            try:
                self.limiter.check_key(key_of(identity, client[0] if client else None))
            except RateLimited as refused:
                await error_response(refused)(scope, receive, send)
                return
        await self.app(scope, receive, send)
