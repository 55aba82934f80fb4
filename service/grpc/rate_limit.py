"""The REST rate limit (service/edge/rate_limit.py) on gRPC calls, from the same buckets.

A call over the rate ends with RESOURCE_EXHAUSTED, reason ``rate_limited``
and a RetryInfo, before the method runs. Health checking and reflection are
not limited, as REST's probes are not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from service.edge.rate_limit import RateLimiter
from service.errors import RateLimited
from service.grpc import status_map
from service.grpc.auth import OPEN_PREFIXES, _refusing, authorization_of

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
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or not self.limiter.enabled
            or handler_call_details.method.startswith(OPEN_PREFIXES)
        ):
            return handler
        try:
            # The peer address is not in the call details: callers without a token
            # share one bucket, as callers behind one proxy would.
            self.limiter.check(authorization_of(handler_call_details), None)
        except RateLimited as refused:
            return _refusing(handler, status_map.from_service_error(refused))
        return handler
