"""A bound on the open streams that need no token: health's Watch and server reflection.

Health checking and reflection stay open (auth.py), as REST's probes and
schema do, but their streams last as long as the client keeps them: each
holds a call, its HTTP/2 stream and a task (1,000 health Watches on one
channel held about 50 MiB), so a client with no token could grow the
service's memory and tasks without end, as the token-bound API Watch cannot
(service/events.py). One client address (an IPv6 address's /64, as the
failed-token budget counts) holds at most ``max_open_streams_per_peer`` and
the process serves at most ``max_open_streams``; a stream past either ends
at its start with RESOURCE_EXHAUSTED, reason ``too_many_streams``. The unary
health ``Check`` is no stream and is never counted.

The server's calls all run on its one event loop: the counts need no lock.
"""

from __future__ import annotations

import contextlib
import inspect
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from service.edge.failed_token_budget import address_key
from service.errors import TooManyStreams
from service.grpc import status_map
from service.grpc.auth import OPEN_PREFIXES
from service.grpc.peer_address import peer_host

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]


class OpenStreams(grpc.aio.ServerInterceptor):
    def __init__(self, max_open: int, max_per_peer: int) -> None:
        self.max_open = max_open
        self.max_per_peer = max_per_peer
        self.by_peer: Counter[bytes] = Counter()
        self.open = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or not handler.response_streaming
            or not handler_call_details.method.startswith(OPEN_PREFIXES)
        ):
            return handler
        return self._counted(handler)

    def _refusal(self, peer: bytes) -> TooManyStreams | None:
        """Why a stream from ``peer`` may not open now; None when it may."""
        if self.by_peer[peer] >= self.max_per_peer:
            return TooManyStreams(
                f"this client address already holds {self.max_per_peer} open health Watch or"
                " reflection streams, its bound (TOPOPLACE_MAX_OPEN_STREAMS_PER_PEER); end one"
                " first, or poll with the unary health Check",
                {"limit": self.max_per_peer, "scope": "peer"},
            )
        if self.open >= self.max_open:
            return TooManyStreams(
                f"this service already serves {self.max_open} open health Watch or reflection"
                " streams, its bound (TOPOPLACE_MAX_OPEN_STREAMS); retry later, or poll with"
                " the unary health Check",
                {"limit": self.max_open, "scope": "service"},
            )
        return None

    async def _take(self, context: Context) -> bytes:
        """A slot for this call's peer (the call ends refused when there is none)."""
        peer = address_key(peer_host(context.peer()))
        refused = self._refusal(peer)
        if refused is not None:
            await status_map.abort(context, status_map.from_service_error(refused))
        self.by_peer[peer] += 1
        self.open += 1
        return peer

    def _give_back(self, peer: bytes) -> None:
        self.open -= 1
        self.by_peer[peer] -= 1
        if self.by_peer[peer] <= 0:
            del self.by_peer[peer]  # one entry per address with a stream open, no more

    def _counted(self, handler: Handler) -> Handler:
        """``handler`` holding a slot from its start to its end, however it ends."""
        make: Any
        inner: Any  # the servicer's coroutine or async generator (the stubs say sync)
        if handler.request_streaming:
            inner, make = handler.stream_stream, grpc.stream_stream_rpc_method_handler
        else:
            inner, make = handler.unary_stream, grpc.unary_stream_rpc_method_handler
        assert inner is not None

        async def writes(request: Any, context: Context) -> Any:  # health's Watch writes
            peer = await self._take(context)
            try:
                return await inner(request, context)
            finally:
                self._give_back(peer)

        async def many(request: Any, context: Context) -> AsyncIterator[Any]:
            peer = await self._take(context)
            try:
                async with contextlib.aclosing(inner(request, context)) as stream:
                    async for message in stream:
                        yield message
            finally:
                self._give_back(peer)

        # The same kind as the inner one: slow_clients.py tells a writer from a generator.
        counted: Handler = make(
            many if inspect.isasyncgenfunction(inner) else writes,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
        return counted
