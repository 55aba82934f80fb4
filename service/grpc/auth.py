"""Bearer tokens for gRPC: the REST check (service/auth.py) on ``authorization`` metadata.

Health checking and reflection stay open, as REST's probes and schema do:
a load balancer cannot present a token, and the schema is not a secret.
A refused call ends with UNAUTHENTICATED before the method runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc

from service.auth import TokenCheck, Unauthorized
from service.grpc import status_map

OPEN_PREFIXES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
if TYPE_CHECKING:  # generic only in the stubs
    Handler = grpc.RpcMethodHandler[Any, Any]


class RequireToken(grpc.aio.ServerInterceptor):
    def __init__(self, check: TokenCheck) -> None:
        self.check = check

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or not self.check.enabled
            or handler_call_details.method.startswith(OPEN_PREFIXES)
        ):
            return handler
        header = None
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode("latin-1")
                break
        try:
            self.check.verify(header)
        except Unauthorized as error:
            return _refusing(handler, status_map.from_service_error(error))
        return handler


def _refusing(handler: Handler, reply: status_map.ErrorReply) -> Handler:
    """A handler of the same shape as ``handler`` that only refuses."""

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await status_map.abort(context, reply)

    async def streaming(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await status_map.abort(context, reply)
        yield  # never reached: makes this a generator, as a streaming handler must be

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    shape = (handler.request_streaming, handler.response_streaming)
    return kinds[shape](
        streaming if handler.response_streaming else unary,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )
