"""A token the process has not verified yet, checked inside the gRPC call.

The interceptor (auth.py) sees a call's method and metadata, not its peer:
grpc.aio's ``HandlerCallDetails`` carries no address. A token the process
knows (static, or verified before) is let through there, as before, with no
more work. Any other is checked in the handler this module wraps around the
method, where ``context.peer()`` names the client, so that its refusals are
counted against the client's address as REST's are
(service/edge/failed_token_budget.py), and a flood of made-up tokens is
answered RESOURCE_EXHAUSTED ``rate_limited`` with a RetryInfo, before any
read or hash. The request message is read either way (a refusal in the
interceptor is a handler that receives it too); the method runs only once
the token is verified and allowed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc

from service.auth import Authenticator, Principal
from service.grpc import status_map
from service.grpc.peer_address import peer_host

if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]
    Context = grpc.aio.ServicerContext[Any, Any]

Admit = Callable[[Principal], "Handler"]


def verified_in_call(
    handler: Handler, check: Authenticator, authorization: str | None, admit: Admit
) -> Handler | None:
    """``handler`` behind a check of ``authorization`` from the call's peer; ``admit`` makes
    the handler a verified principal is served by (its role and scope checked). None for
    a method of a shape the API has none of (a client stream): the caller checks it
    without an address."""

    async def principal_of(context: Context) -> Principal | None:
        try:
            return await check.verify_async(authorization, peer_host(context.peer()))
        except Exception as error:  # refused, limited, or the database down
            await status_map.abort(context, status_map.from_exception(error))
        return None  # not reached: abort raises

    if handler.unary_unary is not None:

        async def unary(request: Any, context: Context) -> Any:
            principal = await principal_of(context)
            assert principal is not None
            inner: Any = admit(principal).unary_unary  # the servicer's coroutine
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    if handler.unary_stream is not None:

        async def streaming(request: Any, context: Context) -> AsyncIterator[Any]:
            principal = await principal_of(context)
            assert principal is not None
            inner: Any = admit(principal).unary_stream  # an async generator
            async with contextlib.aclosing(inner(request, context)) as stream:
                async for message in stream:
                    yield message

        return grpc.unary_stream_rpc_method_handler(
            streaming,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return None
