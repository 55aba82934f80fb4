"""Bearer tokens for gRPC: the REST check (service/auth.py) on ``authorization`` metadata.

The permission each method needs comes from the same table as REST's
(service/access.py). Health checking and reflection stay open, as REST's
probes and schema do. A call without a known token ends with
UNAUTHENTICATED, one whose role does not allow it with PERMISSION_DENIED,
before the method runs. An agent's ReportSnapshot and Heartbeat name their
node in the request, so the scope is checked on the request message, before
the method's body sees it. The principal is the audit log's actor while a
unary method runs (service/audit/actor.py), as on REST. A token the process
has not verified yet is checked inside the call instead, where the client's
address is known, before the method runs (first_sight.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import grpc

from service import access
from service.access import Permission, Role
from service.audit import actor as audit_actor
from service.auth import (
    GRPC_FIELDS,
    Authenticator,
    Forbidden,
    Principal,
    RegionOf,
    Unauthorized,
    out_of_scope_by,
    snapshot_region,
)
from service.edge import revoked_meanwhile
from service.grpc import status_map
from service.grpc.first_sight import verified_in_call

OPEN_PREFIXES = access.GRPC_OPEN_PREFIXES
# The digest of the token a call presents, as the rate limit (rate_limit.py), the
# interceptor before this one, read it: the check looks it up without hashing it again.
# Set with the call's details, and taken only for the same details.
PRESENTED: ContextVar[tuple[grpc.HandlerCallDetails, bytes] | None] = ContextVar(
    "presented", default=None
)
# How often a stream with no message to send checks whether its token was revoked: a
# revocation reaches this process within REVOCATION_POLL_S (service/auth.py), so a quiet
# stream of a revoked token ends within the two together.
REVOCATION_RECHECK_S = 1.0
# How long a stream revoked while it waits to send has its status go out before the server
# stops waiting on the client (see _watch_revocation): the status itself is queued already.
STATUS_GRACE_S = 0.1
if TYPE_CHECKING:  # generic only in the stubs
    Handler = grpc.RpcMethodHandler[Any, Any]


def authorization_of(details: grpc.HandlerCallDetails) -> str | None:
    """The call's ``authorization`` metadata, as the REST header would read."""
    for key, value in details.invocation_metadata or ():
        if key == "authorization":
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


class RequireToken(grpc.aio.ServerInterceptor):
    def __init__(self, check: Authenticator, region_of: RegionOf) -> None:
        self.check = check
        self.region_of = region_of

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        # Read before the token is looked up: a revocation from now on is one made while
        # the call is in flight, checked again before it writes (revoked_meanwhile.py).
        generation = self.check.generation
        header = authorization_of(handler_call_details)
        permission = access.grpc_rule(handler_call_details.method)
        route = "gRPC " + handler_call_details.method.rsplit("/", 1)[-1]
        read = PRESENTED.get()
        identity = read[1] if read is not None and read[0] is handler_call_details else None
        try:
            principal = self.check.cached(header, identity)
            if principal is None:  # not known yet: verified where the peer is known
                deferred = verified_in_call(
                    handler,
                    self.check,
                    header,
                    lambda found: self._admitted(handler, found, permission, route, generation),
                )
                if deferred is not None:
                    return deferred
                principal = await self.check.verify_async(header, None)
        except Exception as error:  # refused, or the database down while checking
            return _refusing(handler, status_map.from_exception(error))
        return self._admitted(handler, principal, permission, route, generation)

    def _admitted(
        self,
        handler: Handler,
        principal: Principal,
        permission: Permission,
        route: str,
        generation: int,
    ) -> Handler:
        """``handler`` as ``principal`` may call it: its role and scope checked (a refusing
        handler when they do not allow it), the audit log's actor set."""
        try:
            if principal.role is Role.AGENT and permission is Permission.REPORT:
                handler = self._scoped(handler, principal)
            else:
                self.check.authorize(principal, permission, None, None)
        except Exception as error:  # forbidden
            return _refusing(handler, status_map.from_exception(error))
        admission = revoked_meanwhile.Admission(self.check, principal.token_id, generation)
        return _acting(self._revocable(handler, principal), principal.actor(route), admission)

    def _revocable(self, handler: Handler, principal: Principal) -> Handler:
        """``handler``, a stream (Watch), ending UNAUTHENTICATED once its token is revoked:
        the check at its start does not hold for the stream's life. Checked before each
        message, and every ``REVOCATION_RECHECK_S`` while none comes, so that a quiet
        stream ends too and frees its watch slot (service/events.py)."""
        inner: Any = handler.unary_stream  # the servicer's async generator
        if inner is None:
            return handler
        check = self.check

        async def streaming(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            stream = inner(request, context)
            sending = asyncio.current_task()  # the server's task, which sends what is yielded
            assert sending is not None
            # Each message is awaited in a task, so that the wait can be cut short for a
            # check; the tasks share one context, as one task iterating would.
            shared = contextvars.copy_context()
            pending: asyncio.Task[Any] | None = None
            try:
                while True:
                    pending = asyncio.create_task(_next(stream), context=shared)
                    await asyncio.wait({pending}, timeout=REVOCATION_RECHECK_S)
                    while not pending.done() and not check.revoked(principal):
                        await asyncio.wait({pending}, timeout=REVOCATION_RECHECK_S)
                    if not pending.done():  # revoked while the stream was quiet
                        pending.cancel()
                        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                            await pending
                        await _refuse_revoked(context)
                    try:
                        message = pending.result()
                    except StopAsyncIteration:
                        return
                    pending = None
                    if check.revoked(principal):
                        await _refuse_revoked(context)
                    # Sending waits while the client reads nothing (its flow-control window
                    # full): a watchdog ends the call if the token is revoked meanwhile.
                    ending = asyncio.Event()  # set once the watchdog starts ending the call
                    watchdog = asyncio.create_task(
                        _watch_revocation(check, principal, context, sending, ending)
                    )
                    try:
                        yield message
                    finally:
                        if not ending.is_set():
                            watchdog.cancel()
                    if ending.is_set():  # the call is ended with UNAUTHENTICATED already
                        return
            finally:
                if pending is not None and not pending.done():  # the client went away
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                        await pending
                await stream.aclose()

        return grpc.unary_stream_rpc_method_handler(
            streaming,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _scoped(self, handler: Handler, principal: Principal) -> Handler:
        """``handler`` behind a check of the node its (unary) request names."""
        inner: Any = handler.unary_unary  # the servicer's coroutine (the stubs say sync)
        assert inner is not None  # ReportSnapshot and Heartbeat are unary

        async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            node = request.node
            region = self.region_of(node)
            field = GRPC_FIELDS.node
            snapshot_json = getattr(request, "snapshot_json", None)
            if principal.region is not None and node not in principal.nodes and snapshot_json:
                claimed = snapshot_region(snapshot_json.encode(), wrapped=False)
                field = out_of_scope_by(principal, region, GRPC_FIELDS)
                region = claimed if region is None or region == claimed else None
            try:
                self.check.authorize(principal, Permission.REPORT, node, region, field=field)
            except Forbidden as error:
                await status_map.abort(context, status_map.from_service_error(error))
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


async def _next(stream: AsyncIterator[Any]) -> Any:
    return await anext(stream)


async def _watch_revocation(
    check: Authenticator,
    principal: Principal,
    context: grpc.aio.ServicerContext[Any, Any],
    sending: asyncio.Task[Any],
    ending: asyncio.Event,
) -> None:
    """Ends the call once ``principal``'s token is revoked; run while the stream waits to
    send a message, where its own check between messages cannot run. The status goes out
    after the messages already queued, which a client that reads nothing never takes: the
    server's ``sending`` task is then cancelled, so that the stream closes (and frees its
    watch slot) without waiting for the client."""
    while True:  # checked just before the message was yielded
        await asyncio.sleep(REVOCATION_RECHECK_S)
        if check.revoked(principal):
            break
    ending.set()
    refusing = asyncio.create_task(_refuse_revoked(context))
    await asyncio.wait({refusing}, timeout=STATUS_GRACE_S)
    if not refusing.done():  # the status waits behind messages the client does not take
        sending.cancel()
        refusing.cancel()
    with contextlib.suppress(asyncio.CancelledError, grpc.aio.AbortError):
        await refusing


async def _refuse_revoked(context: grpc.aio.ServicerContext[Any, Any]) -> None:
    revoked = Unauthorized("the token was revoked while this stream was open")
    await status_map.abort(context, status_map.from_service_error(revoked))


def _acting(
    handler: Handler, actor: audit_actor.Actor, admission: revoked_meanwhile.Admission
) -> Handler:
    """``handler`` run with ``actor`` as the audit log's, and as the caller a Watch stream
    is counted against (service/events.py bounds the watches each token holds). A unary
    call runs under its ``admission``: its token, revoked while its request message
    arrived, ends it UNAUTHENTICATED before the method runs, and its writes check again
    (service/edge/revoked_meanwhile.py)."""
    inner: Any = handler.unary_unary
    if inner is None:
        return _acting_stream(handler, actor)

    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        with (
            audit_actor.acting(actor),
            revoked_meanwhile.admitted(admission),
        ):
            revoked = revoked_meanwhile.refusal()
            if revoked is not None:
                await status_map.abort(context, status_map.from_service_error(revoked))
            return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(
        unary,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


def _acting_stream(handler: Handler, actor: audit_actor.Actor) -> Handler:
    inner: Any = handler.unary_stream
    if inner is None:
        return handler

    async def streaming(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        # The stream is iterated by one task from start to end: the actor is set and
        # reset in its context.
        entered = audit_actor.enter(actor)
        stream = inner(request, context)
        try:
            async for message in stream:
                yield message
        finally:
            await stream.aclose()
            # A stream whose task was cancelled while it waited to send (a revoked token,
            # _watch_revocation) is closed by the loop's finalizer, in another context:
            # the actor was never set there.
            with contextlib.suppress(ValueError):
                audit_actor.leave(entered)

    return grpc.unary_stream_rpc_method_handler(
        streaming,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


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
