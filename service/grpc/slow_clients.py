"""REST's body deadline on gRPC calls: the request message within TOPOPLACE_BODY_TIMEOUT_S.

grpc.aio reads a unary request's message before it runs the handler, and
waits for it without end: a client that starts a call and sends part of its
message, then nothing, held the call (and the part, up to a stream's flow
control window, tens of KiB) for good, any number of them on one connection,
whether or not its token was good (a refusal waits for the message too). REST
ends a body that has not arrived within the deadline (service/edge/guard.py).

Here every handler is served as one that reads its request itself (a
request stream: the same bytes on the wire), so that the read has the
deadline; past it the call ends with DEADLINE_EXCEEDED, reason
``request_timeout``, as REST answers 408. The connection's own idleness is
grpc's ``max_connection_idle`` (server.py).

The message is parsed here too, not by grpc: a message protobuf cannot read (a
string field that is no UTF-8) ended the call with UNKNOWN and no details,
where REST answers a body it cannot parse 400 ``bad_request``; it is
INVALID_ARGUMENT, reason ``bad_request``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

from service.errors import BadRequest, RequestTimeout
from service.grpc import status_map

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]


class MessageDeadline(grpc.aio.ServerInterceptor):
    """Outermost: wraps the handler the other interceptors chose, refusals included."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        return self._reading(handler)

    async def _request(
        self, requests: AsyncIterator[Any], context: Context, parse: Callable[[bytes], Any] | None
    ) -> Any:
        """The call's one message, read within the deadline and parsed (else the call ends)."""
        try:
            async with asyncio.timeout(self.timeout_s):
                raw = await anext(requests)
            return parse(raw) if parse is not None else raw
        except DecodeError as exc:
            unreadable = BadRequest(f"the request message could not be parsed: {exc}")
            await status_map.abort(context, status_map.from_service_error(unreadable))
        except TimeoutError:
            late = RequestTimeout(
                f"the request's message did not arrive within {self.timeout_s:g} s"
                " (TOPOPLACE_BODY_TIMEOUT_S)",
                {"limit_s": self.timeout_s, "part": "body"},
            )
            await status_map.abort(context, status_map.from_service_error(late))
        except StopAsyncIteration:
            missing = status_map.invalid_field("request", "the call sent no message")
            await status_map.abort(context, missing)
        raise AssertionError("abort returns only by raising")

    def _reading(self, handler: Handler) -> Handler:
        # The bytes come in as they are (no deserializer) and _request parses them.
        options: dict[str, Any] = {"response_serializer": handler.response_serializer}
        parse: Any = handler.request_deserializer
        unary: Any = handler.unary_unary  # the inner coroutine (the stubs say sync)
        if unary is not None:

            async def one(requests: AsyncIterator[Any], context: Context) -> Any:
                return await unary(await self._request(requests, context, parse), context)

            return grpc.stream_unary_rpc_method_handler(one, **options)
        streaming: Any = handler.unary_stream
        assert streaming is not None  # the API has no client streams
        if not inspect.isasyncgenfunction(streaming):  # one that writes (health's Watch)

            async def writes(requests: AsyncIterator[Any], context: Context) -> None:
                await streaming(await self._request(requests, context, parse), context)

            return grpc.stream_stream_rpc_method_handler(writes, **options)

        async def many(requests: AsyncIterator[Any], context: Context) -> AsyncIterator[Any]:
            parsed = await self._request(requests, context, parse)
            async with contextlib.aclosing(streaming(parsed, context)) as stream:
                async for message in stream:
                    yield message

        return grpc.stream_stream_rpc_method_handler(many, **options)
