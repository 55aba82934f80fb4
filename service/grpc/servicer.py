"""The gRPC methods: thin, each one converts, calls the service layer, converts back.

The allocations are the one API every caller uses (service/allocations/api.py,
which also publishes the events Watch streams). Its functions block on the
database, so each call runs on the server's worker threads, as FastAPI runs
REST's; the event loop only moves bytes. Every refusal goes through status_map.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import BaseModel, ValidationError

from placement.request import node_names_problem
from placement.text import forbidden_character
from service.admin_actions import Caller
from service.allocations import api as allocations
from service.allocations.results import Allocation
from service.allocations.schemas import ExtendRequest, PlaceRequest, ScoreRequest
from service.audit import actor as audit_actor
from service.auth import GRPC_FIELDS, Authenticator
from service.edge.guard import PLACEMENT_LIMIT_SETTING
from service.errors import AnswerTooLarge, TooLarge, TooManyWatches
from service.event_loop import off_loop
from service.grpc import abandoned, convert, status_map
from service.grpc.gen import topoplace_pb2 as pb
from service.grpc.gen import topoplace_pb2_grpc as pb_grpc
from service.grpc.status_map import ErrorReply
from service.nodes import observed as nodes
from service.nodes.endpoints import MAX_NODE_NAME
from service.nodes.schemas import HeartbeatReport, SnapshotReport
from service.state import ServiceState

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
M2 = TypeVar("M2", bound=Message)
if TYPE_CHECKING:  # generic only in the stubs
    Context = grpc.aio.ServicerContext[Any, Any]
IDEMPOTENCY_KEY = "idempotency-key"
MAX_KEY_LENGTH = 256  # as REST's Idempotency-Key header
# As REST's path parameters bound them (allocations/endpoints.py): proto3 sends an
# unset string as "", and a ReleaseJob without a job id must not release every
# allocation placed with job_id "" (REST refuses an empty one).
MAX_ALLOCATION_ID = 64
# What a gRPC client receives unless told otherwise (grpc-core, grpc-go and grpc-java
# alike: 4 MiB); a client that raised its limit says so in this metadata.
RECEIVE_LIMIT = "max-receive-message-length"
DEFAULT_RECEIVE_BYTES = 4 * 1024 * 1024
MAX_RECEIVE_BYTES = 2**31 - 1  # gRPC's own ceiling on a message
MAX_JOB_ID = 256


class Refused(Exception):
    """A refusal decided while converting, carried out of the worker thread."""

    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(reply.message)
        self.reply = reply


def _validate(model: type[Any], data: dict[str, Any], prefix: str = "") -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise Refused(status_map.from_validation(exc, prefix)) from None


def _validate_json(model: type[M], text: str, field: str) -> M:
    """A message field holding a REST document as JSON; refusals name ``field``."""
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        raise Refused(status_map.from_validation(exc, field)) from None


def _metadata(context: Context, key: str) -> str | None:
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return value if isinstance(value, str) else value.decode("latin-1")
    return None


def _idempotency_key(context: Context) -> str | None:
    """The key as REST reads its header: an HTTP server takes the spaces and tabs around
    a header's value off (RFC 9110), so " k " over REST is "k". Kept over gRPC, the same
    key sent over both transports was two keys, and made two reservations."""
    keys = [value for name, value in context.invocation_metadata() or () if name == IDEMPOTENCY_KEY]
    if len(keys) > 1:  # as REST refuses the header twice (service/edge/guard.py)
        raise Refused(
            status_map.invalid_field(IDEMPOTENCY_KEY, "given more than once: send it once")
        )
    key = _metadata(context, IDEMPOTENCY_KEY)
    return None if key is None else key.strip(" \t")


def _receive_limit(context: Context) -> int:
    """The largest answer the client says it can receive (default: gRPC's 4 MiB)."""
    text = _metadata(context, RECEIVE_LIMIT)
    if text is None:
        return DEFAULT_RECEIVE_BYTES
    text = text.strip(" \t")
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_RECEIVE_BYTES:
        problem = f"a whole number of bytes from 1 to {MAX_RECEIVE_BYTES}"
        raise Refused(status_map.invalid_field(RECEIVE_LIMIT, problem))
    return int(text)


def _fitting(answer: M2, limit: int, what: str, advice: str, **detail: str) -> M2:
    """``answer``, if the client can read it: past its receive limit a client reads
    RESOURCE_EXHAUSTED "Received message larger than max" and nothing else, so it is
    refused instead with ``answer_too_large``, its size, the limit and ``advice``."""
    size = answer.ByteSize()
    if size > limit:
        raise AnswerTooLarge(
            f"{what} is {size} bytes, over the {limit} bytes this client receives; {advice}."
            f" Raise the client's max receive message length and send it in the metadata"
            f" {RECEIVE_LIMIT!r}",
            {**detail, "size": size, "limit": limit, "metadata": RECEIVE_LIMIT},
        )
    return answer


def _receivable(event: pb.Event, limit: int) -> pb.Event:
    """``event``, its allocation without tasks and network blocks (``trimmed``) if the
    whole would pass the watcher's receive limit: the client would read RESOURCE_EXHAUSTED
    and lose the stream, every later event with it. Its id and state still say what
    changed; GetAllocation reads the rest."""
    if event.ByteSize() <= limit:
        return event
    del event.allocation.tasks[:]
    del event.allocation.network_blocks[:]
    event.trimmed = True
    return event


class _Answerable:
    """A Place answer the client can read, checked before the reservation is committed:
    past its receive limit the client gets RESOURCE_EXHAUSTED and no allocation id, so a
    reservation made anyway stays held unseen, and a retry without a key reserves again.
    The message checked is the one sent (``message``): Place converts it once."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.checked: tuple[Allocation, pb.Allocation] | None = None

    def __call__(self, allocation: Allocation) -> None:
        advice = "nothing was reserved (REST's /place has no such bound)"
        answer = convert.allocation(allocation)
        _fitting(answer, self.limit, "the answer to this Place", advice)
        self.checked = (allocation, answer)

    def message(self, allocation: Allocation) -> pb.Allocation:
        """``allocation`` as sent: the message checked, or (a replay) converted now."""
        if self.checked is not None and self.checked[0] is allocation:
            return self.checked[1]
        return convert.allocation(allocation)


# The latest moment a google.protobuf.Timestamp holds, to the nanosecond: the widest
# expiry an answer can carry (a few bytes more than any expiry an extend writes).
_WIDEST_EXPIRY = Timestamp(seconds=253_402_300_799, nanos=999_999_999)


def _change_answerable(
    state: ServiceState, allocation_id: str, limit: int, verb: str, widen_expiry: bool
) -> None:
    """Before a ConfirmAllocation or ExtendAllocation is committed: its answer, which the
    client can read. Committed anyway, the change took effect while the client read
    RESOURCE_EXHAUSTED, and may have taken it as failed. The change touches only
    ``state`` (pending -> active, shorter; degraded kept) and ``expires_at`` (a confirm
    drops it; an extend moves it): the allocation as read now bounds a confirm's answer,
    and, with the widest expiry, an extend's. An unknown id is NotFound here as there."""
    answer = convert.allocation(allocations.get(state, allocation_id))
    if widen_expiry:
        answer.expires_at.CopyFrom(_WIDEST_EXPIRY)
    what = f"the answer to this {verb} of allocation {allocation_id} (bounded before it)"
    route = f"/v1/allocations/{allocation_id}/{verb.removesuffix('Allocation').lower()}"
    advice = f"nothing was changed (REST's POST {route} has no such bound)"
    _fitting(answer, limit, what, advice, allocation_id=allocation_id)


def _check_key(key: str) -> None:
    """The idempotency key as REST's header: 1-256 characters, no control characters."""
    problem = None
    if not key:
        problem = "must not be empty: leave it out for no key"
    elif len(key) > MAX_KEY_LENGTH:
        problem = f"at most {MAX_KEY_LENGTH} characters"
    elif forbidden_character(key) is not None:
        problem = "control characters are not allowed"
    if problem is not None:
        raise Refused(status_map.invalid_field(IDEMPOTENCY_KEY, problem))


def _id(field_name: str, value: str, maximum: int) -> str:
    """An id field as REST's path takes it: 1 to ``maximum`` characters."""
    if not value:
        raise Refused(status_map.invalid_field(field_name, "must not be empty"))
    if len(value) > maximum:
        raise Refused(status_map.invalid_field(field_name, f"at most {maximum} characters"))
    return value


def _allocation_id(value: str) -> str:
    return _id("id", value, MAX_ALLOCATION_ID)


def _node(field_name: str, value: str) -> str:
    """A node name as REST's path takes it. Unbounded, a region-scoped agent's report
    naming a megabyte of node (its interceptor lets names it does not know through)
    was refused with an audit row holding the name twice."""
    return _id(field_name, value, MAX_NODE_NAME)


class TopoplaceServicer(pb_grpc.TopoplaceServicer):
    def __init__(self, state: ServiceState, check: Authenticator) -> None:
        self.state = state
        self.check = check

    async def _run(self, request: Message, context: Context, call: Callable[[], T]) -> T:
        """``call`` on a worker thread, its refusals and faults as gRPC statuses.

        The request's strings are checked first, for every method in this one place.
        """
        field_name = convert.forbidden_string(request)
        if field_name is not None:
            reply = status_map.invalid_field(field_name, "control characters are not allowed")
            await status_map.abort(context, reply)
        try:
            return await off_loop(call)
        except Refused as refused:
            await status_map.abort(context, refused.reply)
        except Exception as exc:
            await status_map.abort(context, status_map.from_exception(exc))
        raise AssertionError("abort returns only by raising")

    # ---- nodes ---------------------------------------------------------------

    async def ReportSnapshot(
        self, request: pb.ReportSnapshotRequest, context: Context
    ) -> pb.SnapshotAccepted:
        authorization = _metadata(context, "authorization")

        def call() -> pb.SnapshotAccepted:
            from placement import NodeSnapshot

            # The interceptor authenticated this header already: a cache hit here.
            caller = Caller.authenticated(self.check, authorization, GRPC_FIELDS)

            name = _node("node", request.node)
            snapshot = _validate_json(NodeSnapshot, request.snapshot_json, "snapshot_json")
            signature = request.signature if request.HasField("signature") else None
            report = _validate(SnapshotReport, {"snapshot": snapshot, "signature": signature})
            accepted = nodes.report_snapshot(self.state, name, report, caller)
            return pb.SnapshotAccepted(
                node=accepted.node, seq=accepted.seq, changed=accepted.changed
            )

        return await self._run(request, context, call)

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: Context
    ) -> pb.HeartbeatResponse:
        authorization = _metadata(context, "authorization")

        def call() -> pb.HeartbeatResponse:
            # The interceptor authenticated this header already: a cache hit here.
            caller = Caller.authenticated(self.check, authorization, GRPC_FIELDS)
            name = _node("node", request.node)
            report = None
            if request.HasField("report_json"):
                report = _validate_json(HeartbeatReport, request.report_json, "report_json")
            nodes.heartbeat_with(self.state, name, report, caller)
            return pb.HeartbeatResponse()

        return await self._run(request, context, call)

    async def ListNodes(
        self, request: pb.ListNodesRequest, context: Context
    ) -> pb.ListNodesResponse:
        def call() -> pb.ListNodesResponse:
            views = nodes.list_nodes(self.state)
            return pb.ListNodesResponse(nodes=[convert.node(v) for v in views])

        return await self._run(request, context, call)

    async def GetNode(self, request: pb.GetNodeRequest, context: Context) -> pb.Node:
        return await self._run(
            request,
            context,
            lambda: convert.node(nodes.get_node(self.state, _node("name", request.name))),
        )

    # ---- placement -----------------------------------------------------------

    async def _bounded(self, request: pb.PlaceRequest | pb.ScoreRequest, context: Context) -> None:
        """REST's bounds on a /place or /score body, before any of its names is read."""
        limit = self.state.settings.max_placement_body_bytes
        size = request.ByteSize()
        if size > limit:
            refusal = TooLarge(
                f"request message of {size} bytes is over the limit of {limit}"
                f" ({PLACEMENT_LIMIT_SETTING})",
                {"limit": limit},
            )
            await status_map.abort(context, status_map.from_exception(refusal))
        for field_name, count in (
            ("nodes", len(request.nodes.names)),
            ("exclude_nodes", len(request.exclude_nodes)),
        ):
            problem = node_names_problem(count)
            if problem is not None:
                await status_map.abort(context, status_map.invalid_field(field_name, problem))

    async def Place(self, request: pb.PlaceRequest, context: Context) -> pb.Allocation:
        await self._bounded(request, context)
        try:
            key = _idempotency_key(context)
        except Refused as refused:
            await status_map.abort(context, refused.reply)
        # Without a key, a reservation whose call ends before its answer is released
        # (abandoned.py); with one, the retry under the key is answered with it.
        handover = abandoned.Handover() if key is None else None

        def call() -> tuple[pb.Allocation, bool]:
            if key is not None:
                _check_key(key)
            answerable = _Answerable(_receive_limit(context))
            body = _validate(PlaceRequest, convert.request_fields(request))
            placed = allocations.place(self.state, body, key, answerable=answerable)
            if handover is not None and handover.made(placed.allocation.id):
                abandoned.release(self.state, placed.allocation.id)
            return answerable.message(placed.allocation), placed.created

        try:
            allocation, created = await self._run(request, context, call)
        except asyncio.CancelledError:
            made = handover.abandon() if handover is not None else None
            if made is not None:
                abandoned.release_later(self.state, made)
            raise
        if not created:
            await status_map.abort(context, status_map.replay(allocation))
        return allocation

    async def Score(self, request: pb.ScoreRequest, context: Context) -> pb.ScoreResponse:
        await self._bounded(request, context)

        def call() -> pb.ScoreResponse:
            fields = convert.request_fields(request)
            limit, offset = fields.pop("limit", None), fields.pop("offset", 0)
            if limit is not None and limit < 1:
                raise Refused(status_map.invalid_field("limit", "must be at least 1"))
            if offset < 0:
                raise Refused(status_map.invalid_field("offset", "must not be negative"))
            body = _validate(ScoreRequest, fields)
            page = allocations.score_page(self.state, body, limit, offset)
            return pb.ScoreResponse(
                nodes=[convert.node_score(v) for v in page.nodes],
                total=page.total,
                offset=page.offset,
                next_offset=page.next_offset,
            )

        return await self._run(request, context, call)

    # ---- allocations ---------------------------------------------------------

    async def GetAllocation(
        self, request: pb.GetAllocationRequest, context: Context
    ) -> pb.Allocation:
        def call() -> pb.Allocation:
            allocation_id = _allocation_id(request.id)
            limit = _receive_limit(context)
            answer = convert.allocation(allocations.get(self.state, allocation_id))
            what = f"allocation {allocation_id}"
            advice = f"GET /v1/allocations/{allocation_id} over REST returns it"
            return _fitting(answer, limit, what, advice, allocation_id=allocation_id)

        return await self._run(request, context, call)

    async def ListAllocations(
        self, request: pb.ListAllocationsRequest, context: Context
    ) -> pb.ListAllocationsResponse:
        def call() -> pb.ListAllocationsResponse:
            limit = _receive_limit(context)
            query = _validate(convert.ListQuery, convert.request_fields(request))
            views = allocations.listing(
                self.state, query.job_id, query.node, query.state, query.limit
            )
            answer = pb.ListAllocationsResponse(allocations=[convert.allocation(v) for v in views])
            # The listing has no pages (nor has REST's), so a cut one could not be told
            # from a whole one: refused, and a smaller limit or a filter is answered.
            advice = "ask for fewer (limit, job_id, node, state), or list over REST"
            what = f"this listing of {len(views)} allocations"
            return _fitting(answer, limit, what, advice)

        return await self._run(request, context, call)

    async def ConfirmAllocation(
        self, request: pb.ConfirmAllocationRequest, context: Context
    ) -> pb.Allocation:
        def call() -> pb.Allocation:
            allocation_id = _allocation_id(request.id)
            limit = _receive_limit(context)
            _change_answerable(self.state, allocation_id, limit, "ConfirmAllocation", False)
            return convert.allocation(allocations.confirm(self.state, allocation_id))

        return await self._run(request, context, call)

    async def ExtendAllocation(
        self, request: pb.ExtendAllocationRequest, context: Context
    ) -> pb.Allocation:
        def call() -> pb.Allocation:
            allocation_id = _allocation_id(request.id)
            body = _validate(ExtendRequest, {"ttl_s": request.ttl_s})
            limit = _receive_limit(context)
            _change_answerable(self.state, allocation_id, limit, "ExtendAllocation", True)
            return convert.allocation(allocations.extend(self.state, allocation_id, body.ttl_s))

        return await self._run(request, context, call)

    async def ReleaseAllocation(
        self, request: pb.ReleaseAllocationRequest, context: Context
    ) -> pb.ReleaseResponse:
        return await self._run(
            request,
            context,
            lambda: pb.ReleaseResponse(
                released=allocations.release(self.state, _allocation_id(request.id)).ids
            ),
        )

    async def ReleaseJob(
        self, request: pb.ReleaseJobRequest, context: Context
    ) -> pb.ReleaseResponse:
        return await self._run(
            request,
            context,
            lambda: pb.ReleaseResponse(
                released=allocations.release_job(
                    self.state, _id("job_id", request.job_id, MAX_JOB_ID), ended=True
                ).ids
            ),
        )

    # ---- events --------------------------------------------------------------

    async def Watch(self, request: pb.WatchRequest, context: Context) -> AsyncIterator[pb.Event]:
        hub = self.state.events
        try:
            limit = _receive_limit(context)
        except Refused as refused:
            await status_map.abort(context, refused.reply)
            return
        try:
            subscription = hub.subscribe(request.kinds, caller=audit_actor.current().token_id)
        except ValueError as exc:
            await status_map.abort(context, status_map.invalid_field("kinds", str(exc)))
            return
        except TooManyWatches as exc:
            await status_map.abort(context, status_map.from_service_error(exc))
            return
        try:
            while True:
                event = await subscription.next()
                if event is None:
                    break
                yield _receivable(convert.event(event), limit)
        finally:
            subscription.close()
        if subscription.overflowed:
            await status_map.abort(context, status_map.watch_overflow(subscription.maxsize))
