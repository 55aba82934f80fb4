"""The REST rate limit (service/edge/rate_limit.py) on gRPC calls, from the same buckets.

A call over the rate ends with RESOURCE_EXHAUSTED, reason ``rate_limited``
and a RetryInfo, before the method runs. The bucket is the token's as the
token check reads the ``authorization`` metadata (service/tokens/presented.py),
however it is spelled; that digest is handed to the token check (auth.py,
the next interceptor) so the call's token is hashed once. Health checking and reflection are
not limited, as REST's probes are not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from service.edge.rate_limit import RateLimiter, key_of
from service.errors import RateLimited
from service.grpc import status_map
from service.grpc.auth import OPEN_PREFIXES, PRESENTED, _refusing, authorization_of
from service.tokens.presented import identity as token_identity

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]


class RateLimit(grpc.aio.ServerInterceptor):
    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter = limiter

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        if not self.limiter.enabled or handler_call_details.method.startswith(OPEN_PREFIXES):
            return await continuation(handler_call_details)
        # The token as the token check reads it, not the metadata as sent: one token
        # spelled many ways is one caller. Read once, for the check too (auth.py).
        identity = token_identity(authorization_of(handler_call_details))
        if identity is None:
            handler = await continuation(handler_call_details)
        else:
            read = PRESENTED.set((handler_call_details, identity))
            try:
                handler = await continuation(handler_call_details)
            finally:
                PRESENTED.reset(read)
        if handler is None:
            return handler
        try:
            # The peer address is not in the call details: callers without a token
            # share one bucket, as callers behind one proxy would.
            self.limiter.check_key(key_of(identity, None))
        except RateLimited as refused:
            return _refusing(handler, status_map.from_service_error(refused))
        return handler
